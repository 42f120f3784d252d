"""`--requirements`, pure parts: the compiled torch parts read from a wheel's metadata and ELF dynamic section,
the decision they drive (load as they are / the registry's torch build under the layer / refused), what the
throwaway container's pip sees of the host's pip configuration, the job's local package folders, pip's
installation report; and the throwaway container's removal on Ctrl-C (a faked engine API)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest

from sim.core.errors import UsageError
from sim.core.spec import ClusterSpec
from sim.engines.userimages import (
    WORK,
    ImageProbe,
    PipSources,
    TorchParts,
    elf_needed,
    in_container_requirements,
    local_requirements,
    parse_pip_config,
    pip_sources,
    report_urls,
    torch_parts,
    unmet_torch_parts,
)

# torch/lib of the two builds of torch 2.13.0 (listed from the local CPU wheel and the registry's wheel).
CPU_LIBS = ("libc10.so", "libgomp.so.1", "libshm.so", "libtorch.so", "libtorch_cpu.so", "libtorch_global_deps.so",
            "libtorch_python.so")  # fmt: skip
CUDA_LIBS = (*CPU_LIBS, "libc10_cuda.so", "libtorch_cuda.so", "libtorch_cuda_linalg.so", "libcaffe2_nvrtc.so")
# torchvision 0.28.0's _C.so as the registry builds it (readelf -d): torch's CUDA libraries among its needs.
TORCHVISION_NEEDS = ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so", "libcudart.so.13",
                     "libc10_cuda.so", "libtorch_cuda.so", "libstdc++.so.6", "libc.so.6")  # fmt: skip


def elf(needed: tuple[str, ...]) -> bytes:
    """A minimal 64-bit little-endian ELF shared object: one PT_LOAD over the whole file, a PT_DYNAMIC with a
    DT_NEEDED per name and a DT_STRTAB given as a virtual address (0x1000 above its file offset), as a linker
    lays them out."""
    vaddr_shift = 0x1000
    strtab = b"\0" + b"".join(name.encode() + b"\0" for name in needed)
    offsets, at = [], 1
    for name in needed:
        offsets.append(at)
        at += len(name) + 1
    header_size, ph_size = 64, 56
    dyn_offset = header_size + 2 * ph_size
    dynamic = b"".join(struct.pack("<qQ", 1, off) for off in offsets)
    str_offset = dyn_offset + len(dynamic) + 2 * 16
    dynamic += struct.pack("<qQ", 5, str_offset + vaddr_shift) + struct.pack("<qQ", 0, 0)
    total = str_offset + len(strtab)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, header_size, 0, 0, header_size, ph_size, 2, 64, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, vaddr_shift, vaddr_shift, total, total, 0x1000)
    dyn = struct.pack("<IIQQQQQQ", 2, 6, dyn_offset, dyn_offset + vaddr_shift, 0, len(dynamic), len(dynamic), 8)
    return header + load + dyn + dynamic + strtab


def wheel(tmp_path: Path, name: str, requires: list[str], members: dict[str, bytes]) -> Path:
    path = tmp_path / f"{name}-1.0-cp311-cp311-linux_x86_64.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-1.0.dist-info/METADATA", metadata)
        for member, data in members.items():
            archive.writestr(member, data)
    return path


def probe(torch_build: str, libs: tuple[str, ...]) -> ImageProbe:
    return ImageProbe(image="img", image_id="sha256:1", user="sim", uid=1000, gids=(1000,), python="/opt/python",
                      version="3.11", site="/s", torch=torch_build.split("+")[0], torch_error=None, dists=(),
                      tools={}, pip=True, torch_build=torch_build, torch_libs=libs)  # fmt: skip


def test_elf_needed_reads_the_dynamic_section():
    assert elf_needed(elf(TORCHVISION_NEEDS)) == list(TORCHVISION_NEEDS)
    assert elf_needed(elf(())) == []
    assert elf_needed(b"#!/bin/sh\n") == [] and elf_needed(b"") == []
    assert elf_needed(elf(("libc10.so",))[:100]) == []  # cut short: nothing, never an exception


def test_elf_needed_reads_a_real_torch_library():
    import torch

    shm = Path(torch.__file__).parent / "lib" / "libshm.so"
    needed = elf_needed(shm.read_bytes())
    assert "libtorch_cpu.so" in needed and "libc10.so" in needed and "libc.so.6" in needed


def test_compiled_torch_parts_are_read_from_the_wheel(tmp_path):
    cuda_ext = wheel(
        tmp_path,
        "torchvision",
        ["numpy", "torch (==2.13.0)", "scipy ; extra == 'scipy'"],
        {
            "torchvision/_C.so": elf(TORCHVISION_NEEDS),
            "torchvision/__init__.py": b"",
            "torchvision.libs/libz.so.1": elf(()),
        },
    )
    parts = torch_parts(cuda_ext)
    assert parts is not None and (parts.name, parts.version, parts.torch_pin) == ("torchvision", "1.0", "==2.13.0")
    assert dict(parts.libraries) == {
        "torchvision/_C.so": ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so", "libc10_cuda.so",
                              "libtorch_cuda.so"),
    }  # fmt: skip
    assert parts.missing(CPU_LIBS) == ("libc10_cuda.so", "libtorch_cuda.so")
    assert parts.missing(CUDA_LIBS) == ()
    # A build for the CPU torch needs only what the CPU build has.
    cpu_ext = wheel(tmp_path, "cpuext", ["torch==2.13.0"], {"cpuext/_C.so": elf(("libtorch_cpu.so", "libc10.so"))})
    assert torch_parts(cpu_ext).missing(CPU_LIBS) == ()


def test_packages_without_compiled_torch_parts_are_left_alone(tmp_path):
    # torch only in an extra; compiled parts that do not link torch; pure Python that needs torch.
    extra = wheel(tmp_path, "a", ["torch ; extra == 'torch'"], {"a/_C.so": elf(("libtorch_cpu.so",))})
    plain = wheel(tmp_path, "b", ["torch>=2"], {"b/_speedups.so": elf(("libc.so.6",))})
    pure = wheel(tmp_path, "c", ["torch"], {"c/__init__.py": b""})
    assert torch_parts(extra) is None and torch_parts(plain) is None and torch_parts(pure) is None


def test_the_decision_loads_as_is_takes_the_registrys_torch_or_refuses_over_an_own_image(tmp_path):
    requirements = tmp_path / "requirements.txt"
    vision = TorchParts("torchvision", "0.28.0", "==2.13.0", {"torchvision/_C.so": ("libtorch_cuda.so", "libc10.so")})
    cpu_only = TorchParts("cpuext", "1.0", "==2.13.0", {"cpuext/_C.so": ("libtorch_cpu.so",)})
    cpu, cuda = probe("2.13.0+cpu", CPU_LIBS), probe("2.13.0", CUDA_LIBS)
    assert unmet_torch_parts(requirements, [cpu_only], cpu, None) == []
    assert unmet_torch_parts(requirements, [vision, cpu_only], cpu, None) == [vision]  # the registry's torch under it
    assert unmet_torch_parts(requirements, [vision], cuda, "team/train:1") == []
    with pytest.raises(UsageError) as refused:
        unmet_torch_parts(requirements, [vision, cpu_only], cpu, "team/cpu:1")
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        f"--requirements '{requirements}': torchvision 0.28.0 (requires torch==2.13.0)"
    )
    assert "--image team/cpu:1's torch 2.13.0+cpu" in line and "libtorch_cuda.so" in line and "cpuext" not in line
    assert "use --image with an image whose torch is the build they were made for" in line


def test_pip_config_is_parsed_from_pip_config_list():
    text = (
        ":env:.find-links='/opt/wheels'\n"
        "global.extra-index-url='file:///opt/pypi/simple https://mirror.example/simple'\n"
        "global.index-url='https://pypi.example/simple'\n"
        "install.index-url='https://install.example/simple'\n"
        "global.constraint='/etc/xdg/pip/constraints.txt'\n"
        "global.cert='/nonexistent/elastic-sim/ca.crt'\n"
        "not a line\n"
    )
    config = parse_pip_config(text)
    assert config["global.extra-index-url"] == "file:///opt/pypi/simple https://mirror.example/simple"
    files = {"/etc/xdg/pip/constraints.txt": "# capped\ntorch<=2.14.1\ntorchvision<=0.29.1  # on disk\n-c other.txt\n"}
    sources = pip_sources(config, read=files.__getitem__)
    assert sources.index_url == "https://install.example/simple"  # a command's section over global
    assert sources.extra_index_urls == ("https://mirror.example/simple",)
    assert sources.left_out == ("file:///opt/pypi/simple", "/opt/wheels")  # folders of this machine
    assert sources.constraints == ("torch<=2.14.1", "torchvision<=0.29.1")
    assert sources.constraints_text("2.13.0") == "torchvision<=0.29.1\ntorch==2.13.0\n"  # the image's torch wins
    conf = sources.pip_conf()
    assert "index-url = https://install.example/simple" in conf and "file://" not in conf and "/opt/wheels" not in conf
    assert "cert" not in conf  # that CA bundle is not a file here
    env_first = pip_sources({":env:.index-url": "https://env.example/simple", "global.index-url": "https://g/simple"})
    assert env_first.index_url == "https://env.example/simple"


def test_the_ca_bundle_goes_in_as_a_file_of_ours(tmp_path):
    bundle = tmp_path / "ca.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    sources = pip_sources({"global.cert": str(bundle)})
    assert sources.cert == str(bundle) and f"cert = {WORK}/ca-bundle.crt" in sources.pip_conf()
    assert PipSources().env()["PIP_CONFIG_FILE"] == f"{WORK}/pip.conf"


def test_local_package_folders_are_copied_in_and_named_there(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "lib").mkdir()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"pyyaml>=6  # a comment\n./pkg\n-e ./lib[fast]\nfile://{tmp_path / 'pkg'}\n")
    assert local_requirements(requirements) == [(2, tmp_path / "pkg"), (3, tmp_path / "lib"), (4, tmp_path / "pkg")]
    assert in_container_requirements(requirements).splitlines() == [
        "pyyaml>=6  # a comment",
        f"{WORK}/local/2",
        f"{WORK}/local/3[fast]",
        f"{WORK}/local/4",
    ]
    requirements.write_text("./missing\n")
    with pytest.raises(UsageError, match=r"line 1: .*missing is no package folder"):
        local_requirements(requirements)
    requirements.write_text("-r base.txt\n")
    with pytest.raises(UsageError, match=r"line 1: '-r base.txt' names another file"):
        local_requirements(requirements)


def test_report_urls_pin_each_file_by_its_hash():
    report = {
        "install": [
            {"download_info": {"url": "https://f/torchvision.whl", "archive_info": {"hashes": {"sha256": "ab"}}}},
            {"download_info": {"url": f"file://{WORK}/local/2", "dir_info": {}}},
            {"download_info": {}},
        ]
    }
    assert report_urls(report) == ["https://f/torchvision.whl#sha256=ab", f"file://{WORK}/local/2"]
    assert report_urls({"install": []}) == []


def test_a_requirements_file_found_by_the_config_is_marked_so(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "reqs.txt").write_text("tqdm\n")
    (tmp_path / "pyproject.toml").write_text('[tool.elastic-sim]\nrequirements = "reqs.txt"\n')
    found = ClusterSpec(script=str(tmp_path / "train.py"))
    assert (found.requirements, found.requirements_found_in) == (
        str(tmp_path / "reqs.txt"),
        str(tmp_path / "pyproject.toml"),
    )
    given = ClusterSpec(script=str(tmp_path / "train.py"), requirements=str(tmp_path / "reqs.txt"))
    assert given.requirements_found_in is None


class _FakeApi:
    def __init__(self):
        self.removed: list[tuple[str, bool]] = []

    def create_host_config(self, **kwargs):
        self.host_config = kwargs
        return kwargs

    def create_container(self, image, **kwargs):
        self.created = (image, kwargs)
        return {"Id": "c1"}

    def start(self, cid):
        pass

    def remove_container(self, cid, force=False):
        self.removed.append((cid, force))


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_the_throwaway_container_is_removed_on_ctrl_c_and_errors(error):
    from sim.engines.docker import Docker

    docker = Docker()
    api = docker.__dict__["api"] = _FakeApi()
    with pytest.raises(error), docker.scratch("img", labels={"elastic-sim.cluster": "c"}, user="1000"):
        raise error()
    assert api.removed == [("c1", True)]
    image, kwargs = api.created
    assert kwargs["labels"] == {"elastic-sim.cluster": "c"} and kwargs["user"] == "1000"
    assert api.host_config["cap_drop"] == ["ALL"] and "binds" not in api.host_config
    assert api.host_config["network_mode"] == "bridge"
