"""int4-head: the target's lm_head as a 4-bit W4A16 weight (see ``patch``)."""
