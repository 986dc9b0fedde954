"""Reading the reports `python -m ntl_jax.t5x.compile_check` wrote into the committed pod
tables (`benchmarks/results/t5x_pod_fit.json`, `t5x_systems_pod.json`)."""


def loss_of(report: dict) -> dict:
    """A report's `ntl` as compile_check writes it now: the number loss as its spec under
    `number_loss`. Results compiled before ntl_jax 0.3.0 name the same spec `ntl_kind`."""
    ntl = dict(report["ntl"])
    if "ntl_kind" in ntl:
        ntl["number_loss"] = ntl.pop("ntl_kind")
    return ntl
