"""The engine a run drives: `Generator`, which problem starts next, one execution of the system, what a run
learns from its servers before the first call, the options it is given."""
