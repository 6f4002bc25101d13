"""One id on everything a world builder writes, and the model installed under that id.

The id goes into the manifest beside each file's digest, into the ONNX model's metadata,
into the model's Triton config (the `world_id` parameter, which the service reads back
from Triton) and, when the world is loaded, into the Redis layout record. The service
checks all of them at start-up (app.world.stamp reads the manifest,
app.release.world_match compares each part).
"""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path
from typing import Any

from app.core.atomic_files import copy_atomically, write_atomically
from app.core.errors import ConfigError
from app.world.layout import MODEL_FILE, SCHEMA_FILE, STAMPED_FILES
from app.world.manifest import update_manifest
from app.world.schema import HEAD_NAMES, HEADS_OUTPUT, FeatureSchema, checked_name, world_schema
from app.world.stamp import WORLD_ID_PARAMETER, file_digest, read_stamp

CONFIG_FILE = "config.pbtxt"


def new_world_id() -> str:
    """Sortable by build time, unique by its random tail."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def _stamp_model(path: Path, world_id: str) -> None:
    import onnx

    model = onnx.load(str(path))
    props = {prop.key: prop.value for prop in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, WORLD_ID_PARAMETER: world_id})
    onnx.save(model, str(path))


def stamp_world(world: Path, schema: FeatureSchema, **manifest: Any) -> str:
    """Give the world a new id; call it last, once every file is written. The manifest is
    written once, here: `manifest`'s fields, the id and each file's digest, merged into what
    an earlier stamp of this world wrote (a world stamped again keeps how it was built)."""
    if not schema.source:
        raise ConfigError("the feature schema has no source text to write into the world")
    world_id = new_world_id()
    (world / SCHEMA_FILE).write_text(schema.source, encoding="utf-8")
    if (world / MODEL_FILE).is_file():
        _stamp_model(world / MODEL_FILE, world_id)
    digests = {
        name: file_digest(world / name) for name in STAMPED_FILES if (world / name).is_file()
    }
    update_manifest(world, **manifest, world_id=world_id, files=digests)
    return world_id


_PARAMETER_BLOCK = re.compile(
    r'parameters\s*:?\s*\{\s*key\s*:\s*"' + WORLD_ID_PARAMETER + r'"\s*value\s*:?\s*'
    r'\{\s*string_value\s*:\s*"[^"]*"\s*\}\s*\}'
)


def with_world_parameter(config: str, world_id: str) -> str:
    """The Triton config text with its world_id parameter set; comments and order are kept.

    The operator's config is edited as text, not rebuilt from protobuf, so that its comments
    stay: the id is put in only once it is a name (letters, digits, `_`, `-`), which no quote,
    backslash or newline can break out of."""
    world_id = checked_name(world_id, "the world's id")
    block = (
        f'parameters: {{\n  key: "{WORLD_ID_PARAMETER}"\n'
        f'  value: {{ string_value: "{world_id}" }}\n}}'
    )
    if _PARAMETER_BLOCK.search(config):
        # A function, not a template: re.sub reads backslashes in a template.
        return _PARAMETER_BLOCK.sub(lambda _: block, config, count=1)
    return config.rstrip("\n") + "\n" + block + "\n"


def with_input_width(config: str, input_name: str, width: int) -> str:
    """The Triton config text with its input's width (dims, warmups, optimisation profile
    shapes) set to `width`: a world whose schema packs more columns (sequence signals)
    serves from the same config files."""
    found = re.search(
        rf'name:\s*"{re.escape(input_name)}"\s*data_type:\s*TYPE_FP32\s*dims:\s*\[\s*(\d+)\s*\]',
        config,
    )
    if found is None or int(found.group(1)) == width:
        return config
    old = found.group(1)
    config = re.sub(rf"dims:\s*\[\s*{old}\s*\]", f"dims: [ {width} ]", config)
    return re.sub(rf"({re.escape(input_name)}:\d+x){old}\b", rf"\g<1>{width}", config)


HEADS_BLOCK = f"""  {{
    name: "{HEADS_OUTPUT}"
    data_type: TYPE_FP32
    dims: [ {len(HEAD_NAMES)} ]
  }}"""


def with_heads_output(config: str, heads: bool) -> str:
    """The Triton config text with the heads output declared when the model answers it
    (`heads`), and without it (the block and the comment lines just above) when it does
    not: a config names only outputs its model has."""
    block = re.compile(rf',?\n(?:[ \t]*#[^\n]*\n)*[ \t]*\{{\s*name:\s*"{HEADS_OUTPUT}"[^}}]*\}}')
    if not heads:
        return block.sub("", config, count=1)
    if block.search(config):
        return config
    outputs = re.search(r"\boutput\s*\[.*?\n\]", config, flags=re.DOTALL)
    if outputs is None:
        return config
    end = outputs.end() - 1  # the closing bracket
    head, tail = config[:end].rstrip("\n"), config[end:]
    return f"{head},\n{HEADS_BLOCK}\n{tail}"


def _onnx_facts(path: Path) -> tuple[list[str], str | None]:
    """The model's output names, and the world id its metadata carries (None: none)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    carried = {prop.key: prop.value for prop in model.metadata_props}.get(WORLD_ID_PARAMETER)
    return [output.name for output in model.graph.output], carried


def inside(root: Path, path: Path) -> Path:
    """`path`, once it is sure to lie under `root` with links and `..` followed: a name the
    pattern let by, or a link planted in the repository, still writes nothing elsewhere."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise ConfigError(f"{path} lies outside {root}: nothing is written there")
    return path


def model_directory(model_repository: Path, model_name: str) -> Path:
    """The model's directory in the repository; its name checked, and the directory inside."""
    name = checked_name(model_name, "the model's name")
    return inside(model_repository, model_repository / name)


def install_model(world: Path, model_repository: Path, model_name: str, version: int = 1) -> Path:
    """Copy the world's model into a version (1 unless told) of its Triton model directory,
    under its id.

    The model directory's config.pbtxt must exist (the local one is model_repository/ in the
    checkout, the GPU one deploy/triton/gpu/); it gets the world's id as a parameter.
    """
    directory = model_directory(model_repository, model_name)
    source = world / MODEL_FILE
    if not source.is_file():
        raise ConfigError(
            f"{world} has no {MODEL_FILE}: build the world with a ranker (recsys build-world) "
            "or put one there"
        )
    config = inside(model_repository, directory / CONFIG_FILE)
    if not config.is_file():
        raise ConfigError(
            f"{config} is missing: copy a model config there first (model_repository/ for "
            "the local CPU Triton, deploy/triton/gpu/ for a GPU)"
        )
    outputs, carried = _onnx_facts(source)
    stamp = read_stamp(world)
    if stamp is not None and carried is not None and carried != stamp.world_id:
        # Checked before anything is copied: Triton would serve another world's model under
        # this world's id, which the start-up check (it reads the config) could not see.
        raise ConfigError(
            f"{source} was stamped for world {carried}, but {world} is world "
            f"{stamp.world_id}: the model is another world's; copy this world's model.onnx "
            "back, or build this world again (a model of your own, which carries no world "
            "id, is installed as it is)"
        )
    target = inside(model_repository, directory / str(version) / MODEL_FILE)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Each file replaced whole: a Triton polling the repository, or a crash, never meets a
    # half-copied model or a half-written config.
    copy_atomically(source, target)
    # A Python-backend model (the local CPU one) runs code beside the ONNX file: a new
    # version gets the code version 1 runs.
    for code in (directory / "1").glob("*.py"):
        copy = inside(model_repository, target.parent / code.name)
        if not copy.exists():
            copy_atomically(code, copy)
    schema = world_schema(world, None)
    original = config.read_text()
    text = with_input_width(original, schema.input_name, schema.width)
    text = with_heads_output(text, HEADS_OUTPUT in outputs)
    if stamp is not None:
        text = with_world_parameter(text, stamp.world_id)
    if text != original:
        write_atomically(config, text.encode())
    return target


def model_beside(model_repository: Path, source_name: str, model_name: str) -> None:
    """A model directory `model_name` made from `source_name`'s configuration and code, for a
    second world's model served beside the first; nothing done where it exists already."""
    # Both names go into the config's `name:` line as text: as names (checked here) no
    # quote or newline can add a field of its own.
    directory = model_directory(model_repository, model_name)
    source = model_directory(model_repository, source_name)
    target = inside(model_repository, directory / CONFIG_FILE)
    if target.is_file():
        return
    if not (source / CONFIG_FILE).is_file():
        raise ConfigError(
            f"{source / CONFIG_FILE} is missing: install the first world's model there first, "
            f"or copy a model config to {target}"
        )
    config = (source / CONFIG_FILE).read_text()
    named = f'name: "{source_name}"'
    if named not in config:
        raise ConfigError(f"{source / CONFIG_FILE} has no line {named}")
    code_directory = inside(model_repository, directory / "1")
    code_directory.mkdir(parents=True, exist_ok=True)
    for code in (source / "1").glob("*.py"):
        copy_atomically(code, inside(model_repository, code_directory / code.name))
    write_atomically(target, config.replace(named, f'name: "{model_name}"').encode())
