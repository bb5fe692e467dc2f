"""Pure scheduling logic: requests, usage accounting, fit with reasons, scoring, state.

No I/O, no asyncio, no clock reads: the scheduler role feeds it objects and the time.
"""
