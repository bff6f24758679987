"""Who a training process is and the names its markers carry: job, rank, GPU.

``launcher`` and ``device`` are pure rules over the environment; ``jobname`` the limits on names that
the client, the agent and the aggregator share; ``process`` applies the rules once at ``chopper.init``.
"""
