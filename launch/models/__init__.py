"""The policy model: its config schema, the tiny and SmolLM2 builders, its local folder."""
