"""Training and evaluation of the complexity classifier. Never imported by the request path."""

from router.training.data import DATA_FILES, Row, load_rows
from router.training.evaluate import EvalReport, evaluate, evaluate_rows
from router.training.export import export_model_file
from router.training.labels import LabelScheme
from router.training.pipeline import PipelineConfig, build_pipeline
from router.training.train import STAGES, Progress, TrainConfig, TrainReport, train

__all__ = [
    "DATA_FILES",
    "STAGES",
    "EvalReport",
    "LabelScheme",
    "PipelineConfig",
    "Progress",
    "Row",
    "TrainConfig",
    "TrainReport",
    "build_pipeline",
    "evaluate",
    "evaluate_rows",
    "export_model_file",
    "load_rows",
    "train",
]
