"""Hugging Face transformers' RMSNorm classes, built with random weights (no download) and wrapped
with :func:`rmsref.adapters.torch.wrap` as the docs tell users to.

transformers keeps one RMSNorm class per model, mostly copies of a few shapes of code (read on
transformers 5.24; about 180 such classes). The shapes, and the entry that stands for each:

- ``LlamaRMSNorm`` (Qwen2, Mistral and ~130 others are copies)::

      hidden_states = hidden_states.to(torch.float32)
      variance = hidden_states.pow(2).mean(-1, keepdim=True)
      hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
      return self.weight * hidden_states.to(input_dtype)

  x̂ rounded to the input dtype, then ·w rounded again: the ``llama`` convention.
- ``GemmaRMSNorm`` (Gemma 1-3): ``output * (1.0 + self.weight.float())`` then ``type_as(x)``: the
  weight used as 1 + w, added in float32, one rounding: ``gemma``.
- ``MuseSparkTextCenteredRMSNorm``: ``(1.0 + self.weight).float()``: the 1 is added in the weight's
  dtype first: ``gemma_wdtype``.
- ``Gemma4RMSNorm``: the weight used as w (no offset any more), ``torch.pow(ms, -0.5)`` in place of
  rsqrt, one rounding: ``torch``.
- ``GptOssRMSNorm``, ``DeepseekV4RMSNorm``: ``(self.weight * hidden_states).to(input_dtype)``: one
  rounding: ``torch``.
- ``T5LayerNorm``: the statistic in float32, x·rstd in float32, rounded to the *weight's* dtype
  when that is half: ``t5``.
- ``CohereLayerNorm``: subtracts the mean: LayerNorm without bias, not RMSNorm.
- ``DeepseekV4UnweightedRMSNorm``: no weight; ``x * rsqrt(...).to(x.dtype)``: rstd rounded to the
  input dtype, then the product rounded: two roundings, as ``llama``'s.

Every one computes in float32 whatever the input (``.to(torch.float32)`` / ``.float()``), so for
float64 input the result is float32-accurate: ``fail:float64_as_float32`` in float64.
eps is read from the module (``variance_epsilon`` or ``eps``); every class reduces over dim -1 only.
"""

from __future__ import annotations

import importlib

from zoo.entry import Callables, ZooEntry, ZooUnavailable

_DTYPES = ("float32", "bfloat16", "float16", "float64")
_HALF_AND_32_PASS = {"float32": "pass", "bfloat16": "pass", "float16": "pass",
                     "float64": "fail:float64_as_float32"}
_HIDDEN = 768


def _class(module: str, name: str):
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ZooUnavailable(f"torch is not installed ({exc}): pip install torch") from exc
    try:
        mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    except ImportError as exc:
        raise ZooUnavailable(f"transformers is not installed or has no {module} model ({exc}): "
                             "pip install -r zoo/requirements.txt") from exc
    try:
        return getattr(mod, name)
    except AttributeError:
        raise ZooUnavailable(f"this transformers has no {module}.{name}") from None


def _instance(module: str, name: str):
    """``build`` for an instance of ``transformers.models.<module>:<name>`` with random weights."""

    def build() -> Callables:
        import torch

        from rmsref.adapters.torch import wrap

        norm = _class(module, name)(_HIDDEN)
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            norm.weight.copy_(norm.weight + 0.1 * torch.randn(_HIDDEN, generator=g))
        return wrap(norm, name=f"{name}({_HIDDEN})")

    return build


def _cls(module: str, name: str):
    def build() -> Callables:
        from rmsref.adapters.torch import wrap

        return wrap(_class(module, name), name=name)

    return build


def _entry(name: str, cls: str, module: str, convention: str, notes: str,
           expected: dict[str, str] = _HALF_AND_32_PASS, as_class: bool = False) -> ZooEntry:
    return ZooEntry(
        name=name,
        title=f"transformers {cls}" + (" (class)" if as_class else " (instance)"),
        package="transformers",
        source=f"transformers.models.{module}.modeling_{module}:{cls}",
        convention=convention,
        build=(_cls if as_class else _instance)(module, cls),
        dtypes=_DTYPES,
        expected=dict(expected),
        normalized_dims="last",
        notes=notes,
    )


_F64 = " float64 input is computed in float32 (.to(torch.float32))."

ENTRIES = [
    _entry("hf-llama", "LlamaRMSNorm", "llama", "llama",
           "x̂ is rounded to the input dtype before ·w, which rounds again (two roundings on "
           "half types); the output dtype is torch's promotion of (weight, input), so a "
           "float32 weight gives float32 output. eps default 1e-6 (variance_epsilon)." + _F64),
    _entry("hf-qwen2", "Qwen2RMSNorm", "qwen2", "llama",
           "A copy of LlamaRMSNorm (as Mistral's and ~130 others are)." + _F64),
    _entry("hf-olmoe", "OlmoeRMSNorm", "olmoe", "llama",
           "Llama's code with its own eps default, 1e-5 (variance_epsilon), read by the "
           "adapter: eps=None probes use it." + _F64),
    _entry("hf-llama4", "Llama4TextRMSNorm", "llama4", "llama",
           "self._norm(x.float()).type_as(x) * self.weight: Llama's two roundings; eps stored "
           "as `eps`, default 1e-5." + _F64),
    _entry("hf-gemma", "GemmaRMSNorm", "gemma", "gemma",
           "Weight used as 1 + w (initialised to zeros), the 1 added in float32, one rounding "
           "((x̂·(1 + w)).type_as(x)); eps default 1e-6 (`eps`)." + _F64),
    _entry("hf-gemma3", "Gemma3RMSNorm", "gemma3", "gemma",
           "Gemma's code (1 + w in float32, one rounding)." + _F64),
    _entry("hf-gemma4", "Gemma4RMSNorm", "gemma4", "torch",
           "Gemma 4 drops the 1 + w offset (weight initialised to ones, used as w) and raises "
           "ms to the power -0.5 with torch.pow instead of rsqrt; one rounding: F.rms_norm's "
           "order. eps default 1e-6." + _F64),
    _entry("hf-gpt-oss", "GptOssRMSNorm", "gpt_oss", "torch",
           "(self.weight * hidden_states).to(input_dtype): w·x̂ in float32, rounded once, as "
           "F.rms_norm (unlike Llama, whose code it otherwise copies). eps default 1e-6." + _F64),
    _entry("hf-t5", "T5LayerNorm", "t5", "t5",
           "x·rstd in float32, rounded to the weight's dtype only when that is half, then ·w: "
           "a float32 weight gives float32 output. The statistic is float32 even for float64 "
           "input (x itself stays float64).",
           expected=_HALF_AND_32_PASS),
    _entry("hf-muse-spark-centred", "MuseSparkTextCenteredRMSNorm", "muse_spark",
           "gemma_wdtype",
           "(1.0 + self.weight).float(): the 1 is added in the weight's dtype, rounding 1 + w "
           "there (bfloat16 keeps 8 bits of it) before the float32 product." + _F64),
    _entry("hf-cohere", "CohereLayerNorm", "cohere", "torch",
           "Named LayerNorm and it is one: the mean is subtracted before the variance "
           "(no bias). Checked as RMSNorm it fails everywhere, as it should: rmsref's LayerNorm "
           "oracle is the reference for it.",
           expected=dict.fromkeys(_DTYPES, "fail:centred_statistic")),
    _entry("hf-deepseek-v4-unweighted", "DeepseekV4UnweightedRMSNorm", "deepseek_v4", "llama",
           "No weight, and eps is its constructor's only parameter (cls(768) would set eps = "
           "768): built from its signature. x * rsqrt(...).to(x.dtype): rstd rounded to the "
           "input dtype, the product rounded again: two roundings, as Llama's." + _F64,
           as_class=True),
]
