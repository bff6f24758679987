"""``chopper predict``: step time at another world size and bandwidth, from the compute/communication split.

``inputs`` reads a recorded run or the aggregator's store (measured compute per step, timed
collectives), ``volumes`` holds each collective's bytes per rank and latency steps,
``fit`` the α–β fit per collective with its residuals and refusals, ``model`` the prediction,
``report`` its text and JSON. Method and sources: docs/PREDICT.md.

Example::

    from chopper.predict import load_inputs, predict
    runs = [load_inputs("run-2", bandwidth_gbs=1.0), load_inputs("run-4", bandwidth_gbs=1.0)]
    p = predict(runs, world_size=8, bandwidth_gbs=0.5)
    p.step_time_s, p.uncertainty_s, p.tokens_per_s, p.mfu, p.exposed_comm_s

numpy and pandas are imported by these modules; ``import chopper`` never imports this package.
"""
from __future__ import annotations

from chopper.predict.fit import Fit, FitRefused, fit_collective
from chopper.predict.inputs import PredictInputError, RunInputs, load_inputs
from chopper.predict.model import Prediction, PredictionRefused, fit_all, predict

__all__ = ["Fit", "FitRefused", "PredictInputError", "Prediction", "PredictionRefused", "RunInputs", "fit_all",
           "fit_collective", "load_inputs", "predict"]
