"""A model's chat template: from its GGUF (`tokenizer.chat_template`), its HF directory
(tokenizer_config.json), or, for a vindex, from the model file it was extracted from; else a
built-in one for the turn markers its vocabulary has (Gemma's, ChatML), else a plain transcript.

Templates are Jinja, rendered as Hugging Face renders them: a sandbox, trim_blocks and lstrip_blocks,
`messages`, `add_generation_prompt`, `bos_token`, `eos_token` and `raise_exception`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from larql.errors import ServeError

if TYPE_CHECKING:
    from larql.model.model import Model

# Gemma: no system role; a system message goes before the first user turn, as Gemma's own template does
GEMMA = ("{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
         "{% set ns.sys = m['content'] + '\n\n' %}{% else %}<start_of_turn>"
         "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{% if m['role'] == 'user' %}{{ ns.sys }}"
         "{% set ns.sys = '' %}{% endif %}{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN = ("{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}Assistant:{% endif %}")


@dataclass(frozen=True)
class ChatTemplate:
    text: str
    origin: str  # where it came from, for /v1/info: "gguf", "tokenizer_config.json", "built-in gemma" ...

    def render(self, model: Model, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt's token ids for `messages` (the template's BOS text is left to the tokenizer,
        which adds BOS itself, so it is not doubled)."""
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ServeError(f"the chat template refused the messages: {message}")

        tok = model.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_ids[0]) if tok.eos_ids else ""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            text = env.from_string(self.text).render(messages=messages, add_generation_prompt=True,
                                                     bos_token=bos, eos_token=eos)
        except TemplateError as e:
            raise ServeError(f"the model's chat template ({self.origin}) failed: {e}") from e
        if bos and text.startswith(bos) and tok.bos_id is not None:
            ids = model.tokenize(text[len(bos):])
            return ids if ids[:1] == [tok.bos_id] else [tok.bos_id, *ids]
        return model.tokenize(text)


def _from_file(path: Path) -> str | None:
    if path.suffix == ".gguf" and path.is_file():
        from larql.model.gguf_file import GGUFFile

        value = GGUFFile(path).metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) and value else None
    config = path / "tokenizer_config.json"
    if path.is_dir() and config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        return value if isinstance(value, str) and value else None
    return None


def find_template(model: Model, source: Path, vindex_index: dict[str, Any] | None = None) -> ChatTemplate:
    """The chat template for `model`, loaded from `source` (a GGUF, an HF directory), else from the
    file a vindex was extracted from (its index.json `source.path`), else built in."""
    candidates = [source]
    if vindex_index is not None:
        candidates.append(Path(str(vindex_index.get("source", {}).get("path", ""))))
    for path in candidates:
        try:
            text = _from_file(path)
        except (OSError, ValueError):  # a moved or damaged source: fall back to a built-in template
            text = None
        if text:
            return ChatTemplate(text, "tokenizer_config.json" if path.is_dir() else f"gguf ({path.name})")
    tok = model.tokenizer
    if tok.token_to_id("<start_of_turn>") is not None:
        return ChatTemplate(GEMMA, "built-in gemma")
    if tok.token_to_id("<|im_start|>") is not None:
        return ChatTemplate(CHATML, "built-in chatml")
    return ChatTemplate(PLAIN, "built-in plain transcript")
