"""NTL in MaxText's metric logger: its evaluation summary, its console lines, and
metrics that come from outside a step (supervised fine-tuning reads them from Tunix)."""

from __future__ import annotations


def number_metric_logger(stock_logger_class):
    """A subclass of MaxText's `MetricLogger` that sums `evaluation/ntl_sum`,
    `evaluation/ntl_weight_sum` and `evaluation/number_targets` over an evaluation into
    `eval/avg_ntl` (NTL's mean over the positions it counts in the evaluation's real
    targets, as `learning/ntl` is a step's) and `eval/number_targets`, logs NTL beside
    MaxText's own line, and writes the scalars in `pending_scalars` with the next metrics
    it writes.

    MaxText empties its `metrics_file` whenever it writes a line of step 0, and each
    evaluation's first running line is one: the training lines before an evaluation were
    lost. This logger empties it at training step 0 only."""
    import json

    from maxtext.common import metric_logger
    from maxtext.utils import max_logging
    from maxtext.utils.globals import EPS

    class NumberLossMetricLogger(stock_logger_class):
        pending_scalars: dict

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.pending_scalars = {}
            self._writing = None

        def write_metrics(self, metrics, step, metric_type="train"):
            if self.pending_scalars:
                metrics["scalar"].update(self.pending_scalars)
                self.pending_scalars = {}
            self._writing = metric_type
            try:
                super().write_metrics(metrics, step, metric_type)
            finally:
                self._writing = None

        def write_metrics_locally(self, metrics, step):
            if self._writing == "train":
                return super().write_metrics_locally(metrics, step)
            line = metric_logger._prepare_metrics_for_json(metrics, step, self.config.run_name)
            with open(self.config.metrics_file, "a", encoding="utf8") as f:
                f.write(json.dumps(line) + "\n")

        def _accumulate_eval_metrics(self, metrics):
            super()._accumulate_eval_metrics(metrics)
            scalars, summed = metrics.get("scalar", {}), self.cumulative_eval_metrics["scalar"]
            for name in ("ntl_sum", "ntl_weight_sum", "number_targets"):
                summed[f"eval/{name}"] += float(scalars.get(f"evaluation/{name}", 0.0))

        def _finalize_eval_metrics(self, train_step):
            summed = self.cumulative_eval_metrics["scalar"]
            summed["eval/avg_ntl"] = summed["eval/ntl_sum"] / max(summed["eval/ntl_weight_sum"], EPS)
            super()._finalize_eval_metrics(train_step)

        def _log_training_metrics(self, metrics, step):
            super()._log_training_metrics(metrics, step)
            _log_ntl(max_logging, metrics["scalar"], step, "learning", "ntl", "")

        def _log_eval_metrics(self, metrics, step):
            super()._log_eval_metrics(metrics, step)
            _log_ntl(max_logging, metrics["scalar"], step, "eval", "avg_ntl", "eval ")

    return NumberLossMetricLogger


def _log_ntl(max_logging, scalars, step, prefix, ntl_name, what):
    if f"{prefix}/{ntl_name}" in scalars:
        # Fine-tuning's counts are Tunix's means over a step's micro-batches.
        count = scalars.get(f"{prefix}/number_targets")
        term = scalars.get(f"{prefix}/ntl_term")
        max_logging.log(f"{what}step {step}: ntl: {float(scalars[f'{prefix}/{ntl_name}']):.4f}"
                        + (f" over {float(count):g} number targets" if count is not None else "")
                        + (f", ntl_term: {float(term):.4f}" if term is not None else ""))
