"""Human-readable bytes and durations, shared by step reasons, tables and the UIs."""


def human_bytes(n: float) -> str:
    """Decimal units, as `--devices` reads them (mem=2TB); past a thousand PB (a size
    computed from a corrupt shape), three figures."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB" if abs(n) < 1000 else f"{n:.3g} PB"


def human_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
