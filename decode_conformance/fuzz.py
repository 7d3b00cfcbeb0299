r"""Fuzz mode: hypothesis draws valid cases across every axis, runs them, and on a failure
shrinks to a minimal case printed as a ready-to-paste regression record.

    python -m pytest --pyargs decode_conformance.suites.parity.test_fuzz --case-set=fuzz \
        --kernel=mypkg.mod:MyDecode --fuzz-examples=200 --fuzz-seed=7 \
        --fuzz-database=.hypothesis/decode-conformance      # (a checkout: suites/parity/test_fuzz.py)

    python -m decode_conformance.fuzz --kernel SPEC --examples 200 --seed 7     # the same, no pytest
    python -m decode_conformance.fuzz --kernel SPEC --case '{"kv_dtype": ...}'   # re-run one case

What is drawn (`case_strategy`, within the kernel's capabilities): every KV dtype, contiguous
or paged caches with page sizes 1..256 (odd ones too) and interleaved K/V pages, 1..4 KV heads
(interpreter; 1..16 on a GPU) with any GQA group 1..16 (MQA and odd groups included), MLA
shapes with 1..32 query heads, head dims 32..256, batches of 1..6 requests whose lengths mix
anything up to the profile's maximum with 0, 1, page and split boundaries +-1 (taken from the
shipped split rules, as the parity set's), windows in both conventions at and around those
boundaries and wider than the request, soft-caps, sinks, custom softmax scales (Gemma-2 27B's
1/sqrt(144) at head dim 128, ...), custom fp8 k/v scales, forced split counts and every data
kind. Everything shrinks toward the simplest case: one short request, bf16, 1 KV head, group
1, head dim 64, page size 16, no window or other feature.

Deterministic from the seed (hypothesis.seed; derandomize stays off so the seed matters) and
with no deadline. With a database directory, failures found earlier replay first (keyed by
kernel and profile) while they fail: a run that passes them deletes their entries (hypothesis),
so the directory speeds the next search up but pins nothing. A find is pinned by its case JSON
in a file the adopter's runs name with --extra-cases (extra_cases.py), where it runs every time.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import time
from dataclasses import dataclass, field
from typing import Optional

from .cases import DATA_KINDS, INPUT_FORMS, Case, window_for
from .fuzz_options import DEFAULT_EXAMPLES, DEFAULT_SEED, DEFAULT_SHRINK_SECONDS
MAX_LEN = {"interpreter": 600, "gpu": 140000}
MAX_KV_HEADS = {"interpreter": 4, "gpu": 16}
MAX_GROUP = 16
MAX_MLA_HEADS = {"interpreter": 32, "gpu": 128}
MAX_BATCH = 6
HEAD_DIMS = (64, 128, 80, 96, 256, 32, 112, 160, 192)
MLA_DIMS = ((576, 512), (288, 256))
PAGE_SIZES = (16, 1, 64, 256, 2, 3, 8, 32, 128, 5, 12, 48)
SOFTCAPS = (30.0, 50.0, 5.0, 1.0)
# Softmax scales that are not 1/sqrt(head_dim) in real models: Gemma-2 27B (query_pre_attn_scalar
# 144 at head dim 128), Gemma-2 9B's 1/sqrt(256) at head dim 256 is the default, Granite's
# attention multiplier 1/128, a YaRN-scaled MLA (mscale 1.3 squared over 1/sqrt(192)).
SCALES = (1 / math.sqrt(144), 1 / 128, 0.125, 1.69 / math.sqrt(192))
FP8_KV_SCALES = (0.25, 2.0, 0.0625, 8.0, 1.0)


def _boundaries(profile: str, page: int) -> list[int]:
    from .case_sets import split_edge, split_unit
    U, E = split_unit(profile), split_edge(profile)
    out = {0, 1, 2}
    for b in (page, 2 * page, U, 2 * U, 4 * U, E):
        out.update({b - 1, b, b + 1})
    return sorted(n for n in out if 0 <= n <= MAX_LEN[profile])


def case_strategy(caps, profile: str = "interpreter", device_type: str = "cpu", max_len: Optional[int] = None):
    """A hypothesis strategy of valid Cases the kernel with `caps` can run."""
    from hypothesis import assume, reject
    from hypothesis import strategies as st

    max_len = max_len or MAX_LEN[profile]
    dtypes = [d for d in ("bf16", "fp16", "e4m3", "e5m2") if d in caps.kv_dtypes]
    page_sizes = [p for p in PAGE_SIZES if caps.page_sizes is None or p in caps.page_sizes]
    layouts = [lay for lay in ("paged", "contig") if lay in caps.layouts]
    head_dims = [d for d in HEAD_DIMS if caps.head_dims is None or d in caps.head_dims]
    if not dtypes or not layouts:
        raise ValueError(f"kernel capabilities allow no case: {caps.describe()}")

    @st.composite
    def draw_case(draw):
        kv_dtype = draw(st.sampled_from(dtypes))
        # Both head structures are drawn whichever the case takes, the MLA flag (False first)
        # between them, so one choice sequence differs from another case's only where the cases
        # differ: hypothesis shrinks to the shortest, then smallest sequence, and while MLA's branch
        # drew fewer choices a bug unrelated to MLA shrank to a 576/512 MLA case.
        if head_dims:
            head_dim = v_head_dim = draw(st.sampled_from(head_dims))
            kv_heads = draw(st.integers(1, MAX_KV_HEADS[profile]))
            q_heads = kv_heads * draw(st.integers(1, MAX_GROUP))
        mla_dims = [(dk, dv) for dk, dv in MLA_DIMS if caps.head_dims is None or dk in caps.head_dims]
        mla = bool(caps.mla and mla_dims and draw(st.booleans()))
        if caps.mla and mla_dims:
            mla_shape = draw(st.sampled_from(mla_dims)), draw(st.integers(1, MAX_MLA_HEADS[profile]))
        if mla:
            (head_dim, v_head_dim), kv_heads, q_heads = mla_shape[0], 1, mla_shape[1]
        else:
            assume(head_dims)
        layout = draw(st.sampled_from(layouts))
        page = 1 if layout == "contig" else draw(st.sampled_from(page_sizes))
        combined = bool(layout == "paged" and draw(st.booleans()) and not mla)
        marks = [n for n in _boundaries(profile, page) if n <= max_len]
        one_len = st.one_of(st.integers(1, min(max_len, 64)), st.sampled_from(marks), st.integers(0, max_len))
        lens = tuple(draw(st.lists(one_len, min_size=1, max_size=MAX_BATCH)))
        window, convention = None, "counts-current"
        if caps.window_convention is not None and draw(st.booleans()):
            longest = max(lens)
            near = sorted({v for v in (longest, longest - 1, longest + 1, longest + 8, longest - page,
                                       longest - page + 1, longest - page - 1, *marks) if v >= 1})
            visible = draw(st.one_of(st.sampled_from(near), st.integers(1, max_len + 8)))
            convention = draw(st.sampled_from(("counts-current", "excludes-current")))
            window = window_for(visible, convention)
            if window < 1:
                window, convention = 1, "counts-current"
        softcap = draw(st.one_of(st.none(), st.sampled_from(SOFTCAPS))) if caps.softcap else None
        sinks = bool(caps.sinks and draw(st.booleans()))
        scale = draw(st.one_of(st.none(), st.sampled_from(SCALES), st.floats(0.01, 0.5)))
        kv_scales = None
        if kv_dtype in ("e4m3", "e5m2"):
            kv_scales = draw(st.one_of(st.none(), st.tuples(st.sampled_from(FP8_KV_SCALES),
                                                             st.sampled_from(FP8_KV_SCALES))))
        num_splits = draw(st.one_of(st.none(), st.integers(1, 64))) if caps.num_splits else None
        kinds = [k for k in DATA_KINDS if k != "huge-scores" or softcap is not None]
        data = draw(st.sampled_from(kinds))
        seed = draw(st.integers(1, 2**31 - 1))  # not 0: case sets re-seed seed-0 cases
        # drawn last, so the draws above (and the recorded demo's search) are what they were
        own_v = not mla and not combined and page > 1 and kv_heads > 1
        inputs = draw(st.sampled_from([f for f in INPUT_FORMS if f != "v-head-major" or own_v]))
        try:
            case = Case(kv_dtype=kv_dtype, num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                        v_head_dim=v_head_dim, mla=mla, seq_lens=lens, layout=layout, page_size=page,
                        combined_kv=combined, window=window, window_convention=convention, softcap=softcap,
                        sinks=sinks, data=data, num_splits=num_splits, seed=seed, scale=scale, kv_scales=kv_scales,
                        inputs=inputs)
        except ValueError:
            reject()
        assume(not caps.missing_for(case, device_type))
        return case

    return draw_case()


# ---- the paste-ready record -------------------------------------------------------------------
_C_DEFAULTS = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, layout="paged", page_size=16)


def case_call(case: Case) -> str:
    """`_c(lens, **fields)` as regressions.py writes its cases: every field that differs from
    `_c`'s base (bf16, 8 query / 2 KV heads, head dim 64, 16-slot pages) or Case's default."""
    import dataclasses
    kw = []
    for f in dataclasses.fields(Case):
        if f.name in ("seq_lens", "label", "note"):
            continue
        v = getattr(case, f.name)
        if f.name == "v_head_dim" and v == case.head_dim:
            continue
        if v != _C_DEFAULTS.get(f.name, f.default):
            kw.append(f"{f.name}={v!r}")
    return f"_c({tuple(case.seq_lens)!r}, " + ", ".join(kw) + ")"


def _clipped(text: str, width: int) -> str:
    """`text`, or its clauses that fit in `width` with " ..." after: a record's summary ends at a
    clause, not mid-word (the whole message stays in the failure output above it)."""
    if len(text) <= width:
        return text
    head = text[:width - 4]
    cut = max(head.rfind("; "), head.rfind(", "), head.rfind(" ("))
    return (head[:cut] if cut > width // 3 else head.rsplit(" ", 1)[0]) + " ..."


def regression_record(case: Case, kernel_name: str, message: str, seed: int, examples: int) -> str:
    import zlib
    label = f"fuzz{zlib.crc32(case.replace(seed=0).id.encode()) & 0xFFFFFF:06x}"
    found = f"decode-conformance fuzz (kernel {kernel_name}, seed {seed}, {examples} examples)"
    summary = _clipped(" ".join(message.split()), 160).replace('"', "'")
    return (f"    Regression(\n"
            f"        \"{label}\", \"{found}\",\n"
            f"        \"{summary}\",\n"
            f"        \"TODO: the property this case checks\",\n"
            f"        lambda p: [{case_call(case)}]),")


def reproduce_lines(kernel_spec: str, case: Case, device: str, seed: int, examples: int, database: Optional[str],
                    suite: Optional[str] = None, pyargs: bool = False) -> list[str]:
    """The case's line and the search's. `suite` names test_fuzz as the pytest run that found it
    did (state.repro_target, with `pyargs`); None: as a command run from here can
    (_paths.suite_test)."""
    if suite is None:
        from ._paths import suite_test
        suite, pyargs = suite_test("parity/test_fuzz.py::test_fuzz")
    one = ["python", "-m", "decode_conformance.fuzz", "--kernel", kernel_spec, "--case", json.dumps(case.to_dict())]
    from .runner import PYTEST_COMMAND
    search = list(PYTEST_COMMAND) + (["--pyargs"] if pyargs else []) + [suite, f"--kernel={kernel_spec}", "--case-set=fuzz",
                                                                       f"--fuzz-seed={seed}", f"--fuzz-examples={examples}"]
    if database:
        search.append(f"--fuzz-database={database}")
    if device != "cpu":
        one += ["--device", device]
        search.append(f"--device={device}")
    return [" ".join(shlex.quote(p) for p in one), " ".join(shlex.quote(p) for p in search)]


# ---- the search ----------------------------------------------------------------------------------
@dataclass
class FuzzOutcome:
    kernel: str
    examples_run: int = 0  # kernel runs, shrinking included
    first_failure_at: int = 0  # the run that first failed
    seconds: float = 0.0
    case: Optional[Case] = None  # the shrunk failing case
    message: str = ""
    record: str = ""
    reproduce: list = field(default_factory=list)
    cases_seen: list = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.case is not None

    def text(self) -> str:
        if not self.failed:
            return f"[{self.kernel}] fuzz: {self.examples_run} examples passed in {self.seconds:.1f} s"
        return "\n".join([
            f"[{self.kernel}] fuzz: example {self.first_failure_at} failed; shrunk to {self.case.id} "
            f"({self.examples_run} runs in all, {self.seconds:.1f} s):",
            f"  {self.message}",
            "  pin it in your repository: append this line to a cases file your runs name with --extra-cases=FILE "
            "(a --fuzz-database folder is no pin: runs that pass a find delete its entries):",
            "  " + json.dumps(self.case.to_dict()),
            "  as a regression record (decode_conformance/regressions.py's REGRESSIONS, in a checkout of this project):",
            self.record,
            "  reproduce this case:   " + self.reproduce[0],
            "  reproduce the search:  " + self.reproduce[1],
        ])


class FuzzFailure(AssertionError):
    def __init__(self, case: Case, message: str):
        super().__init__(f"{case.id}: {message}")
        self.case = case
        self.message = message


def fuzz(kernel, device: str = "cpu", profile: Optional[str] = None, examples: int = DEFAULT_EXAMPLES,
         seed: int = DEFAULT_SEED, database: Optional[str] = None, kernel_spec: Optional[str] = None,
         shrink_seconds: float = DEFAULT_SHRINK_SECONDS, max_len: Optional[int] = None, keep_cases: bool = False,
         suite: Optional[str] = None, pyargs: bool = False, run_one=None) -> FuzzOutcome:
    """Run `examples` drawn cases on `kernel`; on a failure, shrink and describe it. `run_one(case,
    repro)` runs one drawn case and returns its CaseResult (the pytest door, with isolation);
    default: the parity scenario in this process."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis.database import DirectoryBasedExampleDatabase

    from .devices import device_type as device_type_of
    from .devices import profile_of
    from .scenarios import run

    profile = profile or profile_of(device)
    device_type = device_type_of(device)
    if run_one is None:
        def run_one(case, repro):
            return run("parity", kernel, case, device)
    out = FuzzOutcome(kernel.name)
    failing: dict[str, str] = {}
    first_failure: list[float] = []
    t0 = time.perf_counter()

    def check(case):
        out.examples_run += 1
        if keep_cases:
            out.cases_seen.append(case)
        message = failing.get(case.id)
        if message is None:
            if first_failure and time.perf_counter() - first_failure[0] > shrink_seconds:
                return  # shrink budget spent: keep the smallest failure found so far
            res = run_one(case, reproduce_lines(kernel_spec or kernel.name, case, device, seed, examples, database,
                                                suite, pyargs)[0])
            if res.ok:
                return
            message = failing[case.id] = res.message
            if not first_failure:
                first_failure.append(time.perf_counter())
                out.first_failure_at = out.examples_run
        raise FuzzFailure(case, message)  # one raise site: hypothesis tells failures apart by origin

    check._hypothesis_internal_add_digest = f"{kernel.name}|{profile}".encode()
    db = DirectoryBasedExampleDatabase(database) if database else None
    test = settings(max_examples=examples, deadline=None, database=db, derandomize=False, print_blob=False,
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])(
        hseed(seed)(given(case_strategy(kernel.caps, profile, device_type, max_len))(check)))
    try:
        test()
    except FuzzFailure as e:
        out.case, out.message = e.case, e.message
        out.record = regression_record(e.case, kernel.name, e.message, seed, examples)
        out.reproduce = reproduce_lines(kernel_spec or kernel.name, e.case, device, seed, examples, database,
                                        suite, pyargs)
    out.seconds = time.perf_counter() - t0
    return out


def options_from_config(config) -> dict:
    """--fuzz-* options (fuzz_options.py), with the defaults where the plugin has not registered them."""
    from . import fuzz_options as fo

    def get(name, default):
        try:
            v = config.getoption(name)
        except ValueError:
            return default
        return default if v is None else v

    return dict(examples=int(get("--fuzz-examples", fo.default_examples())),
                seed=int(get("--fuzz-seed", fo.default_seed())),
                database=get("--fuzz-database", fo.default_database()) or None,
                shrink_seconds=float(get("--fuzz-shrink-seconds", DEFAULT_SHRINK_SECONDS)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", required=True, help="kernel spec (pkg.module:obj) or entry-point name")
    ap.add_argument("--device", default="cpu",
                    help="cpu (the Triton interpreter), cuda or cuda:N (default: %(default)s)")
    ap.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES,
                    help="cases to draw before stopping (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED,
                    help="hypothesis seed: the same seed draws the same cases (default: %(default)s)")
    ap.add_argument("--database", default=None, help="hypothesis example database directory")
    ap.add_argument("--shrink-seconds", type=float, default=DEFAULT_SHRINK_SECONDS,
                    help="time allowed to shrink a failure to a minimal case (default: %(default)s)")
    ap.add_argument("--case", default=None, help="run this one case (JSON of Case fields) instead of searching")
    args = ap.parse_args(argv)
    from . import _paths
    _paths.alias_checkout()
    if args.device == "cpu":
        from .devices import use_interpreter
        use_interpreter()
    from .kernel_api import kernel_specs, load_kernel
    spec = kernel_specs([args.kernel], env="")[0]
    kernel = load_kernel(spec)
    if args.case:
        from .runner import failure_text, run_case
        case = Case.from_dict(json.loads(args.case))
        res = run_case(kernel, case, args.device)
        print(failure_text(res, case))
        return 0 if res.ok else 1
    res = fuzz(kernel, args.device, examples=args.examples, seed=args.seed, database=args.database,
               kernel_spec=spec, shrink_seconds=args.shrink_seconds)
    print(res.text())
    return 1 if res.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
