"""Bring your own agent: an OpenAI-compatible proxy that records every call an agent program makes, token-exact.

`--system agent` (`agentroll.systems.agent`) runs the agent once per execution against the `Proxy` (`proxy.py`):
a request is checked (`requests.py`: honoured exactly or refused), tied to its execution by its credential, made
as token-exact calls of the execution's `Context` (`session.py`), continuing the call it extends by the model's
own ids (`history.py`, with the messages in their canonical and template forms from `messages.py`), and answered
in OpenAI's format (`replies.py`). `launch.py` runs the agent: a program in a process group of its own, or an
async function. docs/agents.md.
"""
