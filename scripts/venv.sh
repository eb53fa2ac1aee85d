# Sourced by scripts/demo and scripts/test: ensure_venv EXTRA makes .venv and installs the project with EXTRA,
# unless the last install there was of the same extra from the same pyproject.toml (its digest is in the stamp).
ensure_venv() {
  local stamp=".venv/.installed-$1"
  local digest
  digest="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open("pyproject.toml","rb").read()).hexdigest())')"
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
    return 0
  fi
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$1]"
  echo "$digest" > "$stamp"
}
