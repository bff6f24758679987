"""GPU backends, one file each, all behind ``agent.backends.base.Backend``."""
