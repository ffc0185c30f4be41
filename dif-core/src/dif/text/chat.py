"""Text conditioning, step 0: the checkpoint's own chat template, found and rendered as transformers does.

Where it sits: before `dif.text.tokenizer`. A frontend whose reference pipeline calls
`tokenizer.apply_chat_template(...)` renders the same template here, so a checkpoint whose template
differs gets the ids the reference gets. Where the template comes from (a tokenizer folder, the
same places and precedence as transformers' tokenizer loader):
  chat_template.jinja                      the default template (wins over the config entry), and
  additional_chat_templates/<name>.jinja   named templates beside it, else
  tokenizer_config.json "chat_template"    a string, or a list of {"name", "template"}.
With several named templates, the one named "default" is used (dif passes no tools).
`chat_template.json` is a processor file: the tokenizer does not read it, so neither does dif.

Rendering: a sandboxed, immutable Jinja environment with trim_blocks and lstrip_blocks, the loop
controls extension and a pass-through `{% generation %}` block; globals `raise_exception`,
`strftime_now`, `namespace`, `dict`; a `tojson` filter that does not escape HTML. The template sees
`messages`, `tools=None`, `documents=None`, `add_generation_prompt`, the named special tokens of
tokenizer_config.json (bos_token, eos_token, ...) and the caller's extra keywords. Not covered (no
pipeline here passes them): tools, documents, continue_final_message, assistant-token masks, the
reasoning-field aliases transformers adds to messages that carry `reasoning_content`/`thinking`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from attrs import field, frozen

from dif.errors import CheckpointError

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
CONFIG_FILE = "tokenizer_config.json"
PROCESSOR_TEMPLATE_FILE = "chat_template.json"
# The special tokens transformers hands every template (its `special_tokens_map`), when set.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@frozen
class Message:
    role: str
    content: str


@frozen
class ChatTemplate:
    """One checkpoint's chat template: its Jinja text, the file it came from (for errors) and the
    special tokens the template may read. Compiled on first render, so a folder whose template is
    broken still loads for frontends that never render it."""

    text: str
    source: str
    special_tokens: Mapping[str, str] = field(factory=dict)

    def render(
        self, messages: Sequence[Message | Mapping[str, Any]], *, add_generation_prompt: bool = False, **kwargs: Any
    ) -> str:
        """The text `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...,
        **kwargs)` returns for one conversation."""
        if not messages:
            raise CheckpointError(f"{self.source}: cannot render a chat template for an empty conversation")
        chat = [_plain_message(m) for m in messages]
        variables = {**self.special_tokens, **kwargs}  # the caller's keywords win, as in transformers
        template = _compile(self.text, self.source)
        try:
            return str(
                template.render(
                    messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **variables
                )
            )
        except Exception as exc:  # whatever the template does wrong is the checkpoint's problem, not dif's
            raise CheckpointError(
                f"{self.source}: the chat template failed while rendering: {type(exc).__name__}: {exc}",
                hint="the template raised or used a value it cannot handle; compare it with the model's published one",
            ) from None


def find_chat_template(folder: str | Path, config: Mapping[str, Any] | None = None) -> ChatTemplate | None:
    """The chat template of a tokenizer folder (see the module docstring for where it is looked
    for), or None when there is none. `config` is the parsed tokenizer_config.json when the caller
    already read it."""
    folder = Path(folder)
    if config is None:
        from dif.checkpoint import read_json_object

        config = read_json_object(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else {}
    special = {name: text for name in SPECIAL_TOKEN_NAMES if (text := token_text(config.get(name))) is not None}
    templates = _template_files(folder)
    if not templates:
        templates = _config_templates(folder / CONFIG_FILE, config.get("chat_template"))
    if not templates:
        return None
    if "default" not in templates:
        names = sorted(templates)
        raise CheckpointError(
            f"{folder}: several chat templates ({', '.join(names)}) and none named 'default'",
            hint=f"add {TEMPLATE_FILE}, or name one of them 'default'",
        )
    text, source = templates["default"]
    return ChatTemplate(text, source, special)


def missing_template_error(folder: str | Path) -> CheckpointError:
    """The error for a frontend that needs a chat template where the folder has none."""
    folder = Path(folder)
    hint = f'add the model\'s template as {folder / TEMPLATE_FILE} (or a "chat_template" entry in {CONFIG_FILE})'
    if (folder / PROCESSOR_TEMPLATE_FILE).is_file():
        hint += f"; {PROCESSOR_TEMPLATE_FILE} is read only by processors, not by the tokenizer the pipeline uses"
    return CheckpointError(
        f'{folder}: no chat template ({TEMPLATE_FILE}, or "chat_template" in {CONFIG_FILE})', hint=hint
    )


# -- finding -----------------------------------------------------------------------------------
def _template_files(folder: Path) -> dict[str, tuple[str, str]]:
    """{name: (text, file)} from chat_template.jinja ("default") and additional_chat_templates/*.jinja."""
    found: dict[str, tuple[str, str]] = {}
    files = [("default", folder / TEMPLATE_FILE)]
    if (folder / TEMPLATE_DIR).is_dir():
        files += [(p.name.removesuffix(".jinja"), p) for p in sorted((folder / TEMPLATE_DIR).glob("*.jinja"))]
    for name, path in files:
        if path.is_file():
            try:
                found[name] = (path.read_text(encoding="utf-8"), str(path))
            except (OSError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{path}: cannot read the chat template: {exc}") from None
    return found


def _config_templates(config_file: Path, entry: Any) -> dict[str, tuple[str, str]]:
    """{name: (text, source)} from tokenizer_config.json's "chat_template" (a string or a named list)."""
    source = f'{config_file} "chat_template"'
    if entry is None:
        return {}
    if isinstance(entry, str):
        return {"default": (entry, source)}
    if isinstance(entry, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str) for t in entry
    ):
        return {t["name"]: (t["template"], f"{source} (template '{t['name']}')") for t in entry}
    raise CheckpointError(
        f'{source}: expected a string or a list of {{"name": ..., "template": ...}}, got {type(entry).__name__}'
    )


def token_text(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it (a string, or an AddedToken dict with "content")."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _plain_message(message: Message | Mapping[str, Any]) -> dict[str, Any]:
    """A message as the template sees it: a plain dict, keys whose value is None dropped (as transformers does)."""
    items = {"role": message.role, "content": message.content} if isinstance(message, Message) else dict(message)
    return {key: value for key, value in items.items() if value is not None}


# -- compiling ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)  # a pipeline renders the same template for every prompt
def _compile(text: str, source: str) -> Any:
    """The template compiled in transformers' environment (see the module docstring)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _namespace_class()
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise CheckpointError(
            f"{source}: the chat template is not valid Jinja: {exc.message} (template line {exc.lineno})",
            hint="fix the template, or restore the model's published one",
        ) from None


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)  # reported by ChatTemplate.render with the file named


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the rendered prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates without handing them the type itself (no attribute access to it)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _namespace_class() -> type:
    """Jinja's `namespace`, refusing underscore names so templates cannot reach interpreter internals."""
    import jinja2
    import jinja2.utils

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with '_'")

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: `namespace(self=...)` works
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    return TemplateNamespace


def _generation_extension() -> type:
    """`{% generation %}...{% endgeneration %}` renders its body unchanged (transformers uses it to
    find assistant tokens for training masks; a prompt needs only the text)."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationBlock(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return GenerationBlock
