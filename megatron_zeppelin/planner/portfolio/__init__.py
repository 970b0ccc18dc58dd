"""The portfolio Zeppelin weighs beside its partitioner: every baseline's fixed shape as a candidate
(shapes), and memory as a constraint on the pick (memory)."""
