"""Generation: engine protocol, transformers and vLLM engines, Ray rollout workers, weight sync."""
