"""Continuous batching across requests: the scheduler (`scheduler.BatchingSessions`) that turns
every caller's encoder and decoder calls into shared model calls, its pure packing (`pack`), its
options and step records (`records`), the slab of windows' cross K/V (`cross_slab`) and the
encoder's and decoder's turns on the CPU (`core_turns`)."""
