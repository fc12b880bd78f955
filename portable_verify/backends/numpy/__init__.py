"""The numpy reference: docs/semantics.md as code, for chains and trees."""
