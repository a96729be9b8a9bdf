"""`specviz probe`: black-box A/B of OpenAI-compatible servers, greedy, token by token.

The same prompts are decoded twice (alone vs. together on one server, or on server A vs. B); where
the answers part, the logprobs of the tokens both sides still agree on measure the numerical noise
between them, and each divergence is called `numerical` (within that noise, on a prompt that does
not stand out) or `suspect`. Speculative servers: placeholder logprobs of drafted tokens are
counted and left out, and the drafting they report (`telemetry`) is compared across concurrency
levels. Layers, one way: telemetry → responses → client → scans → compare → attribution → report →
advice; `runner` drives them (levels, rounds, calibrations), `cli` is the command.
"""
