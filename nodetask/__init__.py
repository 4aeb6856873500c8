"""The shared core of nodetaskd: action flows, routes and messages, phase maths, the job pool.

Backend-neutral: it uses anyio only, so the same code runs in every role and under any anyio backend.
"""
