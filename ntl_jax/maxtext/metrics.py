"""NTL in MaxText's metric logger: its evaluation summary, its console lines, and
metrics that come from outside a step (supervised fine-tuning reads them from Tunix)."""

from __future__ import annotations


def number_metric_logger(stock_logger_class):
    """A subclass of MaxText's `MetricLogger` that sums `evaluation/ntl_sum` and
    `evaluation/number_targets` over an evaluation into `eval/avg_ntl` (NTL over the
    evaluation's real targets, as `eval/avg_loss` is its cross-entropy) and
    `eval/number_targets`, logs NTL beside MaxText's own line, and writes the scalars in
    `pending_scalars` with the next metrics it writes."""
    from maxtext.utils import max_logging
    from maxtext.utils.globals import EPS

    class NumberLossMetricLogger(stock_logger_class):
        pending_scalars: dict

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.pending_scalars = {}

        def write_metrics(self, metrics, step, metric_type="train"):
            if self.pending_scalars:
                metrics["scalar"].update(self.pending_scalars)
                self.pending_scalars = {}
            super().write_metrics(metrics, step, metric_type)

        def _accumulate_eval_metrics(self, metrics):
            super()._accumulate_eval_metrics(metrics)
            scalars, summed = metrics.get("scalar", {}), self.cumulative_eval_metrics["scalar"]
            summed["eval/ntl_sum"] += float(scalars.get("evaluation/ntl_sum", 0.0))
            summed["eval/number_targets"] += float(scalars.get("evaluation/number_targets", 0.0))

        def _finalize_eval_metrics(self, train_step):
            summed = self.cumulative_eval_metrics["scalar"]
            summed["eval/avg_ntl"] = summed["eval/ntl_sum"] / (summed["eval/total_weights"] + EPS)
            super()._finalize_eval_metrics(train_step)

        def _log_training_metrics(self, metrics, step):
            super()._log_training_metrics(metrics, step)
            _log_ntl(max_logging, metrics["scalar"], step, "learning/ntl", "learning/number_targets", "")

        def _log_eval_metrics(self, metrics, step):
            super()._log_eval_metrics(metrics, step)
            _log_ntl(max_logging, metrics["scalar"], step, "eval/avg_ntl", "eval/number_targets", "eval ")

    return NumberLossMetricLogger


def _log_ntl(max_logging, scalars, step, ntl_key, count_key, what):
    if ntl_key in scalars:
        max_logging.log(f"{what}step {step}: ntl: {float(scalars[ntl_key]):.4f} over "
                        f"{int(scalars.get(count_key, 0))} number targets")
