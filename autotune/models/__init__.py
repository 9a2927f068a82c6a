"""Which model: the registry (name -> source and architecture facts) and its weights on disk (converted once,
loaded offline)."""
