"""Shell completion for ``dpu``, written from its argparse parser (``dpu completion bash|zsh``).

Nothing here names a command or an option: the script is generated from the
parser ``dpu.cli`` builds, so it cannot drift from it. It completes

- the command names (after ``dpu`` and its global options);
- each command's options, and the global ones, after a ``-``;
- an option's value: its choices (``--io``, ``--log-level``, ...), file names
  for the options and arguments that take a file, directories for ``--out-dir``;
- a positional argument with choices (``dpu ct dump|flush``).

bash: ``source <(dpu completion bash)``, or the output saved as
``/usr/share/bash-completion/completions/dpu``. zsh: ``source <(dpu
completion zsh)`` (the bash function through zsh's ``bashcompinit``).
Nothing beyond bash itself (``compgen``, ``compopt``) is needed.
"""
from __future__ import annotations

import argparse
import re
from typing import Dict, Iterable, List, Tuple

SHELLS = ("bash", "zsh")

# What an option or positional argument holds, from its name: a file, a directory.
_DIRS = re.compile(r"(^|[-_])dir$")
_FILES = re.compile(r"(flows|config|topology|file|output|pcap|ctl|in|inputs)$")


def _subparsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _value_kind(a: argparse.Action) -> Tuple[str, List[str]]:
    """How to complete what an option or argument takes: ("words", choices), ("dir", []),
    ("file", []), or ("none", []) for a number or an expression."""
    if a.choices:
        return "words", [str(c) for c in a.choices]
    name = (a.option_strings[-1].lstrip("-") if a.option_strings else a.dest).replace("_", "-")
    if _DIRS.search(name):
        return "dir", []
    if _FILES.search(name) or _FILES.search(str(a.metavar or "").lower()):
        return "file", []
    return "none", []


def _takes_value(a: argparse.Action) -> bool:
    return bool(a.option_strings) and a.nargs != 0 and not isinstance(a, (argparse._HelpAction,
                                                                             argparse._VersionAction))


def _options(parser: argparse.ArgumentParser) -> List[str]:
    return [o for a in parser._actions for o in a.option_strings]


def _quote(words: Iterable[str]) -> str:
    return " ".join(words).replace("'", "")


def _reply(kind: str, words: List[str]) -> str:
    if kind == "words":
        return f"COMPREPLY=($(compgen -W '{_quote(words)}' -- \"$cur\"))"
    if kind == "dir":
        return 'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur"))'
    if kind == "file":
        return 'compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur"))'
    return "COMPREPLY=()"


def bash(parser: argparse.ArgumentParser, prog: str = "dpu") -> str:
    """The bash completion script for `parser` (its commands are its subparsers)."""
    fn = "_" + re.sub(r"\W", "_", prog)
    subs = _subparsers(parser)
    value_cases: List[str] = []  # "CMD:OPTION) reply;;": what an option's value completes to
    everywhere = {(o, _reply(*_value_kind(a))) for a in parser._actions if _takes_value(a) for o in a.option_strings}
    for cmd, sp in [("*", parser)] + list(subs.items()):
        for a in sp._actions:
            reply = _reply(*_value_kind(a)) if _takes_value(a) else None
            opts = [o for o in a.option_strings if cmd == "*" or (o, reply) not in everywhere]
            if reply and opts:
                value_cases.append(f"        {'|'.join(f'{cmd}:{o}' for o in opts)}) {reply}; return;;")
    values = sorted({o for sp in [parser, *subs.values()] for a in sp._actions if _takes_value(a)
                     for o in a.option_strings})
    opt_cases = [f"        {cmd}) opts='{_quote(_options(sp))}';;" for cmd, sp in subs.items()]  # globals included
    pos_cases = []
    for cmd, sp in subs.items():
        positional = [a for a in sp._actions if not a.option_strings]
        for i, a in enumerate(positional):
            kind, words = _value_kind(a)
            if kind != "none":
                pos_cases.append(f"        {cmd}:{i}) {_reply(kind, words)}; return;;")
    return f"""# bash completion for {prog}, generated from its argparse parser by `{prog} completion bash`.
# Install: source <({prog} completion bash), or save it as /usr/share/bash-completion/completions/{prog}.
{fn}() {{
    local cur prev cmd="" npos=0 i w opts
    COMPREPLY=()
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    # The command is the first word that names one; the words after it that are not
    # options or option values are its positional arguments.
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "$w" in
            -*) ;;
            *)
                [[ " {_quote(values)} " == *" ${{COMP_WORDS[i-1]}} "* ]] && continue  # an option's value
                if [[ -z "$cmd" ]]; then
                    case " {_quote(subs)} " in *" $w "*) cmd="$w";; esac
                else
                    npos=$((npos + 1))
                fi;;
        esac
    done
    case "$cmd:$prev" in
{chr(10).join(value_cases)}
    esac
    if [[ "$cur" == -* ]]; then
        case "$cmd" in
{chr(10).join(opt_cases)}
        *) opts='{_quote(_options(parser))}';;
        esac
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return
    fi
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W '{_quote(subs)}' -- "$cur"))
        return
    fi
    case "$cmd:$npos" in
{chr(10).join(pos_cases)}
    esac
}}
complete -F {fn} {prog}
"""


def zsh(parser: argparse.ArgumentParser, prog: str = "dpu") -> str:
    """The zsh completion script: the bash one, through zsh's bashcompinit."""
    return (f"# zsh completion for {prog}, generated from its argparse parser by `{prog} completion zsh`.\n"
            f"# Install: source <({prog} completion zsh) in ~/.zshrc.\n"
            "autoload -U +X compinit && compinit\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + bash(parser, prog))


def script(shell: str, parser: argparse.ArgumentParser, prog: str = "dpu") -> str:
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r} (shells: {', '.join(SHELLS)})")
    return bash(parser, prog) if shell == "bash" else zsh(parser, prog)


__all__ = ["SHELLS", "bash", "script", "zsh"]
