import platform

from ntl_jax.train.machine import cpu_model


def test_cpu_model_reads_the_first_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                    "model name\t: Intel(R) Xeon(R) Processor @ 2.10GHz\n"
                    "processor\t: 1\nmodel name\t: another\n")
    assert cpu_model(str(info)) == "Intel(R) Xeon(R) Processor @ 2.10GHz"


def test_cpu_model_falls_back_to_platform_without_a_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nHardware\t: something\n")
    expected = platform.processor() or platform.machine()
    assert cpu_model(str(info)) == expected
    assert cpu_model(str(tmp_path / "missing")) == expected
