"""The search space: dimensions read from YAML, what each may take, which change numerics, and how a trial's
parameters are suggested."""
