#!/usr/bin/python3
"""Checks Kubernetes YAML documents against the object models of the official Python client, offline.

    /usr/bin/python3 tools/k8s_schema_check.py FILE_OR_DIR...

Every document (each file, or each *.yaml of a directory, may hold several) is walked against the model of its
apiVersion/kind from Debian 12's python3-kubernetes (22.6.0, generated from Kubernetes 1.22's OpenAPI
specification): each model's `openapi_types` gives the fields and their types, `attribute_map` their JSON names,
and a model's setter refuses None for a required field. Fails, naming the file, the document and the field's
path, on an unknown field, a value of the wrong type, or a missing required field. Exit 0 when every document
passes, 1 when one does not, 2 when the check cannot run (no python3-kubernetes, a file that is not YAML).

Used by experiments_k8s_render_test on `fl-experiment render --launcher kubernetes`'s output (docs/cluster.md).
What it does not check: values (names' syntax, quantities, enum members; the client validates none of them), and
fields newer than Kubernetes 1.22.
"""

import os
import sys

try:
    import yaml
    import kubernetes.client as k8s
    from kubernetes.client import Configuration
except ImportError as e:  # the checker is a test-only tool: say what to install
    sys.stderr.write(f"k8s_schema_check: {e}: install python3-kubernetes and python3-yaml "
                     "(deploy/install-deps.sh installs both) and run with /usr/bin/python3\n")
    sys.exit(2)

# The API group of each kind this checker knows (the Python client's model names carry only the version).
GROUPS = {
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "PersistentVolumeClaim": "v1",
    "Pod": "v1",
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "StatefulSet": "apps/v1",
    "Deployment": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}

_CONFIG = Configuration()
_CONFIG.client_side_validation = True
_required_cache = {}


def required(cls, attr):
    """Whether the model's setter refuses None for `attr` (the generated client's mark of a required field)."""
    key = (cls, attr)
    if key not in _required_cache:
        obj = cls.__new__(cls)
        obj.local_vars_configuration = _CONFIG
        try:
            setattr(obj, attr, None)
            _required_cache[key] = False
        except ValueError:
            _required_cache[key] = True
    return _required_cache[key]


def type_name(value):
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def walk(value, typ, path, errors):
    """Checks `value` against the client's type string `typ` at `path`, appending messages to `errors`."""
    if typ.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: is {type_name(value)}, must be a list ({typ})")
            return
        for i, item in enumerate(value):
            walk(item, typ[5:-1], f"{path}[{i}]", errors)
        return
    if typ.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: is {type_name(value)}, must be a mapping ({typ})")
            return
        inner = typ[typ.index(",") + 1:-1].strip()
        for key, item in value.items():
            if not isinstance(key, str):
                errors.append(f"{path}: key {key!r} is {type_name(key)}, must be a string")
            walk(item, inner, f"{path}.{key}", errors)
        return
    if typ == "object":  # IntOrString, quantities, free-form: any value
        return
    if typ in ("str", "datetime", "date"):
        ok = isinstance(value, str)
    elif typ == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif typ == "bool":
        ok = isinstance(value, bool)
    else:
        cls = getattr(k8s, typ, None)
        if cls is None:
            errors.append(f"{path}: the client has no model {typ}")
            return
        walk_model(value, cls, path, errors)
        return
    if not ok:
        errors.append(f"{path}: is {type_name(value)} ({value!r}), must be {typ}")


def walk_model(value, cls, path, errors):
    if not isinstance(value, dict):
        errors.append(f"{path}: is {type_name(value)}, must be a mapping ({cls.__name__})")
        return
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        attr = by_json.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {cls.__name__} "
                          f"(known: {', '.join(sorted(cls.attribute_map.values()))})")
            continue
        if item is None:
            continue
        walk(item, cls.openapi_types[attr], f"{path}.{key}", errors)
    for attr, json_name in cls.attribute_map.items():
        if value.get(json_name) is None and required(cls, attr):
            errors.append(f"{path}.{json_name}: missing, required by {cls.__name__}")


def check_document(doc):
    """The errors of one document (a list of messages with field paths)."""
    if not isinstance(doc, dict):
        return [f"the document is {type_name(doc)}, must be a mapping with apiVersion and kind"]
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    if not isinstance(kind, str) or not isinstance(api_version, str):
        return ["apiVersion and kind: missing or not strings"]
    if kind not in GROUPS:
        return [f"kind: {kind} is not one this checker knows ({', '.join(sorted(GROUPS))})"]
    if GROUPS[kind] != api_version:
        return [f"apiVersion: {api_version} is not {kind}'s ({GROUPS[kind]})"]
    version = api_version.split("/")[-1]
    cls = getattr(k8s, version[0].upper() + version[1:] + kind, None)
    if cls is None:
        return [f"the client has no model for {api_version} {kind}"]
    errors = []
    walk_model(doc, cls, kind, errors)
    return errors


def files_of(args):
    for arg in args:
        if os.path.isdir(arg):
            for name in sorted(os.listdir(arg)):
                if name.endswith((".yaml", ".yml")):
                    yield os.path.join(arg, name)
        else:
            yield arg


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    failed = 0
    documents = 0
    for path in files_of(argv[1:]):
        try:
            with open(path, encoding="utf-8") as f:
                docs = list(yaml.safe_load_all(f))
        except (OSError, yaml.YAMLError) as e:
            sys.stderr.write(f"k8s_schema_check: {path}: {e}\n")
            return 2
        for i, doc in enumerate(docs):
            if doc is None:
                continue
            documents += 1
            name = ""
            if isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
                name = f" {doc.get('kind')} {doc['metadata'].get('name')}"
            for error in check_document(doc):
                print(f"{path}: document {i + 1}{name}: {error}")
                failed += 1
    if documents == 0:
        sys.stderr.write("k8s_schema_check: no documents found\n")
        return 2
    if failed:
        print(f"k8s_schema_check: {failed} error(s) in {documents} document(s)")
        return 1
    print(f"k8s_schema_check: {documents} document(s) match the Kubernetes {k8s.__name__} models")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
