"""The chat format used when a model file ships no chat template: the turn format the model was
trained on, not one format for all (ChatML turns fed to Gemma read to it as plain text).

The vocabulary decides first, because it holds the format's own special tokens (SmolLM2 is a
``llama`` file with ChatML's ``<|im_start|>``); a vocabulary without any of them falls back on the
family (``general.architecture`` or config.json's ``model_type``), and ChatML when neither says.
Templates come from the families' own (Gemma, Meta Llama 3, Qwen, Phi-3, Llama 2 / Mistral),
reduced to plain turns; rendered in the same sandbox as a file's template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FallbackTemplate:
    name: str  # what `models inspect` shows: "Gemma <start_of_turn>"
    text: str  # Jinja, with messages, add_generation_prompt, bos_token, eos_token
    reason: str = ""  # why this one: "the vocabulary has <start_of_turn>", "family gemma3"


# a leading system message: Gemma and Llama 2 have no system turn, their templates put it before the first user's text
_SYSTEM_FIRST = (
    "{% if messages and messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] ~ '\n\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set sys = '' %}{% set turns = messages %}{% endif %}"
)
GEMMA = FallbackTemplate(
    "Gemma <start_of_turn>",
    "{{ bos_token }}"
    + _SYSTEM_FIRST
    + (
        "{% for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
        "{{ sys if loop.first else '' }}{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
)
LLAMA3 = FallbackTemplate(
    "Llama 3 <|start_header_id|>",
    (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
)
CHATML = FallbackTemplate(
    "ChatML <|im_start|>",
    (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
)
PHI3 = FallbackTemplate(
    "Phi-3 <|user|>",
    (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
)
INST = FallbackTemplate(
    "Llama 2 / Mistral [INST]",
    "{{ bos_token }}"
    + _SYSTEM_FIRST
    + (
        "{% for m in turns %}{% if m['role'] == 'user' %}[INST] {{ sys if loop.first else '' }}{{ m['content'] }} [/INST]"
        "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    ),
)

# a special token of the format, in the vocabulary → that format
_MARKERS = (
    ("<start_of_turn>", GEMMA),
    ("<|start_header_id|>", LLAMA3),
    ("<|im_start|>", CHATML),
    ("<|assistant|>", PHI3),
    ("[INST]", INST),
)
# family name prefix (GGUF architecture or HF model_type) → format
_FAMILIES = (("gemma", GEMMA), ("qwen", CHATML), ("phi3", PHI3), ("mistral", INST), ("llama", LLAMA3))


def fallback_for(family: str | None, has_token: Callable[[str], bool], sentencepiece: bool = False) -> FallbackTemplate:
    """The fallback for a model of ``family`` whose vocabulary holds a token t when ``has_token(t)``.
    A ``llama`` SentencePiece vocabulary without markers is Llama 2's ([INST]), a BPE one Llama 3's."""
    from dataclasses import replace

    for marker, template in _MARKERS:
        if has_token(marker):
            return replace(template, reason=f"the vocabulary has {marker}")
    fam = (family or "").lower()
    for prefix, template in _FAMILIES:
        if fam.startswith(prefix):
            template = INST if template is LLAMA3 and sentencepiece else template
            return replace(template, reason=f"family {family}")
    return replace(CHATML, reason="neither the vocabulary nor the family names a format: the most common")
