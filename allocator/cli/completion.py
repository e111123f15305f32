"""``allocator completion bash|zsh``: shell completion, with job and host names from the store.

The script is generated from the CLI's own argument parser (shtab), so it
knows every command and option of this version, and nothing is imported on
an ordinary run to make completion work. ``key=value`` words complete their
keys (``job=``, ``gpus=``, ...) and, for ``job=`` and ``host=``, names read
from the store by ``allocator completion names job|host``: the policy's
jobs and hosts, the job index, and hosts with history (two small reads).
That command gives up silently after 1.5 seconds (``NAMES_SECONDS``; the
script also runs it under ``timeout``), so a slow or unreachable store never
hangs a shell.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import CliArgumentParser, add_common_options

__all__ = ["NAMES_SECONDS", "WORD_KEYS", "register", "script"]

#: The longest ``completion names`` may take before it prints nothing.
NAMES_SECONDS = 1.5
#: The keys each key=value command takes (a test checks them against the commands).
WORD_KEYS = {
    "set": ("job", "gpus", "count", "host", "reason", "command", "slots", "prefer", "time"),
    "get": ("job", "host"),
    "release": ("job", "host", "reason"),
    "status": ("host", "pool", "job", "state", "user"),
    "queue": ("host", "user"),
    "cancel": ("job", "host", "user"),
    "history": ("job", "host", "gpu"),
    "env": ("job", "host", "worker"),
    "run": ("job", "count", "gpus", "host", "slots", "ttl", "grace", "time"),
    "submit": ("job", "count", "gpus", "host", "slots", "time", "grace", "output"),
    "doctor": ("host",),
}


def register(commands: Any) -> None:
    """Add ``completion`` and its subcommands."""
    parser = commands.add_parser(
        "completion",
        help="print a bash or zsh completion script",
        description=__doc__,
    )
    sub = parser.add_subparsers(dest="shell", metavar="SHELL", parser_class=CliArgumentParser)
    sub.required = True
    for shell in ("bash", "zsh"):
        sub.add_parser(shell, help=f"the {shell} completion script").set_defaults(handler=run)
    names = sub.add_parser("names", help="job or host names for completion (used by the scripts)")
    names.add_argument("kind", choices=("job", "host"))
    add_common_options(names)
    names.set_defaults(handler=run_names)


def run(args: argparse.Namespace) -> int:
    """Print the completion script for ``args.shell``."""
    print(script(args.shell), end="")
    return 0


def script(shell: str) -> str:
    """The completion script for ``bash`` or ``zsh``."""
    import shtab

    from allocator.cli import build_parser

    parser = build_parser()
    _short_descriptions(parser)
    words = _words_actions(parser)
    for command, action in words.items():
        action.complete = {"zsh": f"_allocator_words {command}"}  # type: ignore[attr-defined]
    if shell == "zsh":
        text: str = shtab.complete(parser, "zsh", preamble=_zsh_preamble())
        for command in words:  # every key=value word, not just the first: a rest argument
            text = text.replace(
                f'"(*)::key\\=value:_allocator_words {command}"',
                f'"*::key\\=value:_allocator_words {command}"',
            )
        return text
    bash: str = shtab.complete(parser, "bash")
    return bash + _bash_words(_value_options(parser))


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _short_descriptions(parser: argparse.ArgumentParser) -> None:
    """Show each command's one-line help in the menu, not its whole description."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                sub.description = helps.get(name) or sub.description
                _short_descriptions(sub)


def _words_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    actions = {}
    for name, sub in _subparsers(parser).items():
        for action in sub._actions:
            if action.dest == "words" and name in WORD_KEYS:
                actions[name] = action
    return actions


def _value_options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string, in any command, that takes a value."""
    options: set[str] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            if action.option_strings and action.nargs != 0:
                options.update(action.option_strings)
        stack.extend(_subparsers(current).values())
    return sorted(options)


def _keys_table(indent: str, fmt: str) -> str:
    return "\n".join(indent + fmt.format(c, " ".join(k)) for c, k in sorted(WORD_KEYS.items()))


def _bash_words(value_options: list[str]) -> str:
    keys = _keys_table("    ", '{}) echo "{}" ;;')
    return f"""
# --- allocator: key=value words, names from the store ---------------------------
_allocator_keys() {{
  case "$1" in
{keys}
  esac
}}

_allocator_names() {{  # $1 = job|host; the rest: --store/--prefix as typed
  local limit=""
  command -v timeout >/dev/null 2>&1 && limit="timeout 2"
  $limit allocator completion names "$@" 2>/dev/null
}}

_allocator_complete() {{
  local line="${{COMP_LINE:0:COMP_POINT}}"
  local cur="${{line##*[[:space:]]}}"
  local -a typed
  read -ra typed <<< "$line"
  [[ -n $cur ]] && unset 'typed[${{#typed[@]}}-1]'
  local prev="${{typed[${{#typed[@]}}-1]}}" cmd="" word i
  local -a store=()
  for ((i = 1; i < ${{#typed[@]}}; i++)); do
    word="${{typed[i]}}"
    case "$word" in
      --store|--prefix) store+=("$word" "${{typed[i+1]}}") ;;
      --store=*|--prefix=*) store+=("$word") ;;
    esac
    [[ -z $cmd && -n $(_allocator_keys "$word") ]] && cmd="$word"
  done
  if [[ -z $cmd || $cur == -* || " {" ".join(value_options)} " == *" $prev "* ]]; then
    _shtab_allocator "$@"
    return
  fi
  if [[ $cur == *=* ]]; then
    local key="${{cur%%=*}}" value="${{cur#*=}}" candidates=""
    case "$key" in
      job|host) candidates="$(_allocator_names "$key" "${{store[@]}}")" ;;
      gpus) candidates="cpu" ;;
    esac
    [[ $COMP_WORDBREAKS == *=* ]] || value="$cur" candidates="$(printf "$key=%s\\n" $candidates)"
    COMPREPLY=($(compgen -W "$candidates" -- "$value"))
  else
    COMPREPLY=($(compgen -W "$(printf '%s= ' $(_allocator_keys "$cmd"))" -- "$cur"))
    compopt -o nospace 2>/dev/null
  fi
}}

complete -o bashdefault -F _allocator_complete allocator
"""


def _zsh_preamble() -> str:
    keys = _keys_table("  ", "{}) keys=({}) ;;")
    return f"""
_allocator_names() {{  # $1 = job|host; the --store/--prefix typed on the line
  local -a store
  local i
  for ((i = 1; i < ${{#words}}; i++)); do
    case "${{words[i]}}" in
      --store|--prefix) store+=("${{words[i]}}" "${{words[i+1]}}") ;;
      --store=*|--prefix=*) store+=("${{words[i]}}") ;;
    esac
  done
  if (( $+commands[timeout] )); then
    timeout 2 allocator completion names "$1" "${{store[@]}}" 2>/dev/null
  else
    allocator completion names "$1" "${{store[@]}}" 2>/dev/null
  fi
}}

_allocator_words() {{  # the last argument: the command whose key=value words are typed
  local -a keys names
  case "${{@[-1]}}" in
{keys}
  esac
  if compset -P '*='; then
    case "${{IPREFIX%=}}" in
      job|host) names=(${{(f)"$(_allocator_names "${{IPREFIX%=}}")"}}); compadd -a names ;;
      gpus) compadd cpu ;;
    esac
  else
    compadd -S '' -- ${{^keys}}=
  fi
}}
"""


# --- names ---------------------------------------------------------------------------------


class _TooSlow(Exception):
    """The store took longer than completion may wait."""


def run_names(args: argparse.Namespace) -> int:
    """Print known job or host names, one a line; print nothing on any trouble (exit 0)."""
    import signal

    def give_up(_signum: int, _frame: object) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, NAMES_SECONDS)
    try:
        names = _names(args)
    except (Exception, _TooSlow):  # completion offers what it can, never an error
        names = set()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    for name in sorted(names):
        print(name)
    return 0


def _names(args: argparse.Namespace) -> set[str]:
    import os

    from allocator.errors import AllocatorError
    from allocator.records.keys import DEFAULT_PREFIX, KeyLayout, validate_name, validate_prefix
    from allocator.store import open_store, resolve_store_url

    url = resolve_store_url(getattr(args, "store", None))
    prefix = getattr(args, "prefix", None) or os.environ.get("ALLOCATOR_PREFIX") or DEFAULT_PREFIX
    layout = KeyLayout(validate_prefix(prefix))
    store = open_store(url)
    try:
        section = "jobs" if args.kind == "job" else "hosts"
        found = _policy_names(store, layout, section)
        index = layout.jobs if args.kind == "job" else layout.history_heads
        found |= {kv.key[len(index) :] for kv in store.list(index).items}
    finally:
        store.close()
    valid = set()
    for name in found:
        try:
            valid.add(validate_name(name))
        except AllocatorError:  # a name someone wrote by hand: not one to offer
            continue
    return valid


def _policy_names(store: Any, layout: Any, section: str) -> set[str]:
    """The names under ``section`` of the applied policy (read, not validated: only offered)."""
    import yaml

    from allocator.records.codec import decode_record
    from allocator.records.types import PolicyRecord

    item = store.get(layout.policy)
    if item is None:
        return set()
    document = yaml.safe_load(decode_record(item.value, PolicyRecord, item.key).yaml)
    names = document.get(section) if isinstance(document, dict) else None
    return {str(name) for name in names} if isinstance(names, dict) else set()
