"""The Chopper cluster aggregator (job-level attribution, stragglers, Parquet store).

Not built yet: it arrives with the aggregator issue. The package and its console script exist
so that the distribution's layout and entry points are stable from the start.
"""
