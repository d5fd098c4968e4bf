"""A model file without a chat template gets its own family's turn format, not ChatML for all
(issue 31 item 7), and `models inspect` says which fallback it used and why."""

from __future__ import annotations

import pytest
from opscope.engine.cli.main import main
from opscope.engine.formats import open_model
from opscope.engine.testing.gguf_writer import hf_config, write_gguf

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def family_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("fallback")

    def make(family: str):
        path = root / f"{family}.gguf"
        if not path.exists():
            write_gguf(path, hf_config(family))  # gguf_writer writes no chat template
        return path

    return make


def _inspect_line(capsys, path) -> str:
    assert main(["models", "inspect", str(path)]) == 0
    return next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("chat_template"))


@pytest.mark.parametrize(
    "family, arch, name",
    [
        ("gemma2", "gemma2", "Gemma <start_of_turn>"),
        ("gemma3", "gemma3", "Gemma <start_of_turn>"),
        ("qwen2", "qwen2", "ChatML <|im_start|>"),
        ("phi3", "phi3", "Phi-3 <|user|>"),
        ("llama", "llama", "Llama 3 <|start_header_id|>"),
    ],
)
def test_inspect_names_the_family_fallback(capsys, family_file, family, arch, name):
    source = open_model(family_file(family))
    assert source.chat_template is None
    assert _inspect_line(capsys, family_file(family)).split(None, 1) == [
        "chat_template",
        f"absent: {name} fallback (family {arch})",
    ]


def test_gemma_without_a_template_is_prompted_in_gemma_turns(family_file):
    tok = open_model(family_file("gemma2")).tokenizer
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
    # Gemma has no system turn: its own template puts the system text before the first user text
    assert tok.apply_chat_template(CHAT) == (
        f"{bos}<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_llama3_fallback_turns(family_file):
    tok = open_model(family_file("llama")).tokenizer
    bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
    assert tok.apply_chat_template(CHAT) == (
        f"{bos}<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_the_vocabulary_s_format_wins_over_the_family(tmp_path, capsys, default_model_path):
    from gguf_craft import Craft

    # the embedded model is a llama file whose vocabulary is ChatML's (<|im_start|>): without its
    # template it must still get ChatML, not Llama 3's headers
    path = Craft.read(default_model_path).drop("tokenizer.chat_template").write(tmp_path / "no_template.gguf")
    assert _inspect_line(capsys, path).split(None, 1) == [
        "chat_template",
        "absent: ChatML <|im_start|> fallback (the vocabulary has <|im_start|>)",
    ]
    tok = open_model(path).tokenizer
    assert tok.apply_chat_template(CHAT[1:]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
