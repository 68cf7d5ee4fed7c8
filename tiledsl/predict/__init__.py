"""Predict a program's time at any world from its schedule: every rank's instances simulated on the
lanes that run them (SM programs, the copy engine), waits released when their producers' data has
arrived, each instance costed from its FLOPs and bytes against one GPU's rates (`rates.py`,
`h200.json`) over a link model (NVLink within a node, IB across). `tiledsl predict` prints it."""
from tiledsl.predict.rates import Rates, load
from tiledsl.predict.simulate import Prediction
from tiledsl.predict.simulate import simulate as predict

__all__ = ["Prediction", "Rates", "load", "predict"]
