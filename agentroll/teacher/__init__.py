"""Distillation data: a teacher model's logprobs on every token a student sampled (docs/distill.md).

`settings`: the options and the value object a teacher is made from; `scorer`: the teacher's client and what it
writes into a record; `check`: the vocabulary it must share with the student, checked by token ids. The figures
over the scores (student minus teacher, KL) are `agentroll.record.stats`'; a folder scored after the fact is
`agentroll.tools.distilling`'s.
"""
