"""The settings of the shared `traces` fixture (tests/conftest.py): one ragged batch of the tiny pair."""

# Mixed prompt lengths make the batch ragged from the first step.
RAGGED_PROMPTS = ["hello world", "a", "the quick brown fox jumps over", "xyz", "speculative decoding", "ab cd ef"]
RAGGED_K = 3  # drafts per step
RAGGED_FAULTS = ("column-positions", "stale-kv", "masked-holes", "extra-accept")
