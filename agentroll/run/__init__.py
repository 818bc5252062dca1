"""One `generate` run: the runner, the Ray driver and its task, the plan without Ray, progress, and what the
run adds around the generator (`run_options`)."""
