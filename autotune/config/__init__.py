"""What is deployed and under which load: the frozen deployment configuration (DeployConfig, with the one list of
each knob's values) and the workload a benchmark runs. The bottom of the tree: it imports nothing of autotune's
but the errors."""
