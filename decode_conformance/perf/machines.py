"""Which machine a record comes from, and how far machines of one GPU model are apart. A record
names the GPU's UUID and read bandwidth; a run on another UUID, or whose read bandwidth is more
than MACHINE_READ_TOLERANCE off, is on another machine, where the measured machine-to-machine
spread of the class (fixtures/perf_machine_spread.toml) widens every threshold and eagerly
timed (host-bound) cells never gate."""
from __future__ import annotations

from typing import Optional

SPREAD_FILE = "perf_machine_spread.toml"
# One machine's read bandwidth, measured repeatedly, moved <= 0.3 %; two H200s measured 2-4 %
# apart (fixtures/perf_machine_spread.toml): 1 % is over 3x the one and under half the other.
MACHINE_READ_TOLERANCE = 0.01


def load_spread(gpu_class: str, path=None) -> Optional[dict]:
    """The class's row of the spread table ({spread, read_tbs, source, ...}), None without one;
    errors name the file and the field."""
    from ..resources import read_toml
    path, data = read_toml(path, SPREAD_FILE)
    row = data.get(gpu_class)
    if row is None:
        return None
    s = row.get("spread")
    if not isinstance(s, (int, float)) or isinstance(s, bool) or not 0 <= s < 1 or not isinstance(row.get("source"), str):
        raise ValueError(f"{path}: [{gpu_class}]: expected 'spread' (a fraction in [0, 1)) and 'source' (text), "
                         f"got spread={s!r}")
    return dict(row)


def other_machine(rec: dict, info: dict) -> Optional[str]:
    """Why `rec` (a record cell's fields) was taken on another GPU than the one `info`
    describes - another UUID where both have one, or a read bandwidth off by more than
    MACHINE_READ_TOLERANCE - or None when it looks like the same GPU."""
    then, now = rec.get("gpu_uuid"), info.get("gpu_uuid")
    read_then, read_now = rec.get("read_tbs"), info.get("read_tbs")
    drift = read_now / read_then - 1 if read_then and read_now else 0.0
    why = []
    if then and now and then != now:
        why.append(f"recorded on GPU {then}, this is {now}")
    if abs(drift) > MACHINE_READ_TOLERANCE:
        why.append(f"this GPU reads at {read_now:.2f} TB/s, the record's at {read_then:.2f} ({drift:+.1%})")
    return "; ".join(why) or None
