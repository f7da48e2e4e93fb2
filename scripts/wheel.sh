#!/usr/bin/env bash
# Sourced by the engine stages (SGLang, vLLM) BEFORE they activate their own venv: builds the
# wheel in the base venv's environment (scripts/venv.sh), the one the test stage's
# `maturin develop` already built in, so cargo finds everything fresh and only packs the wheel
# (seconds). Building inside another venv would rebuild pyo3 and the extension from scratch
# (minutes): pyo3's build script reruns whenever VIRTUAL_ENV, PATH or PYO3_PYTHON changes.
# Sets PEERCACHE_WHEEL and defines install_peercache_wheel, called once the engine's venv is
# active: every venv here runs the same python3, so the one wheel fits them all.
_wheel_dir="${CARGO_TARGET_DIR:-target}/wheels/peercache-engines"
rm -rf "$_wheel_dir"
(
  source scripts/venv.sh
  maturin build --release -q -m peercache-py/Cargo.toml -o "$_wheel_dir" >&2
)
PEERCACHE_WHEEL=$(ls "$_wheel_dir"/peercache-*.whl)
export PEERCACHE_WHEEL
install_peercache_wheel() {
  pip install -q --disable-pip-version-check --no-deps --force-reinstall "$PEERCACHE_WHEEL"
}
