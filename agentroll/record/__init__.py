"""The record's vocabulary: the sample, the group, counters that add up, reading model text, the head-to-head
comparison."""
