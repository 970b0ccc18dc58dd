"""The portfolio Zeppelin weighs beside its partitioner: every baseline's fixed shape as a candidate
(shapes), and Zeppelin planned under a memory cap for --zeppelin-balance-memory (memory). The pick's
own memory rule is planner/choice.py."""
