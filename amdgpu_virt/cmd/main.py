"""``amdgpu-virt``: the command line interface (a cliff application).

Sub-commands are plugins in the ``amdgpu_virt.cli`` entry point namespace;
multi-word commands (``nova config``) are registered with underscores.

Every command exits with a status of one table
(:mod:`amdgpu_virt.cmd.exitcodes`): an error of the project's hierarchy
is printed as ``error: <message>`` (the message names the culprit) and
exits with its family's status; any other exception is a bug, printed as
``internal error`` with its type and exiting 70; a traceback is printed
only with ``--debug``. A wrong command line exits 64, argparse's message
naming the option.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence
from typing import Any

from cliff import app
from cliff import commandmanager
from cliff import display
from cliff import help
from oslo_config import cfg

from amdgpu_virt import conf as av_conf
from amdgpu_virt import exception
from amdgpu_virt import fileutil
from amdgpu_virt.cmd import exitcodes
from amdgpu_virt.conf import opts as av_conf_opts

LOG = logging.getLogger(__name__)

DESCRIPTION = """\
Share AMD Instinct GPUs across OpenStack Nova and Kubernetes: discover GPUs,
partitions and SR-IOV VFs, decide per workload between a dedicated GPU, a
VF or a CU slice, and drive Nova and Kubernetes from one plan."""


def _version() -> str:
    """pbr's full version: the git tag, or a .devN version past it."""
    try:
        import pbr.version
        return str(pbr.version.VersionInfo('amdgpu_virt').release_string())
    except Exception:  # not installed: running from a source tree
        return 'unknown'


class CommandManager(commandmanager.CommandManager):
    """cliff's command manager, recording the commands' entry points
    without importing them: only the command that runs is imported
    (cliff's own imports every command module at start, and with them the
    OpenStack and Kubernetes client libraries)."""

    def load_commands(self, namespace: str) -> None:
        self.group_list.append(namespace)
        for entry in sorted(importlib.metadata.entry_points(group=namespace),
                            key=lambda e: (e.name, e.value)):
            name = (entry.name.replace('_', ' ') if self.convert_underscores
                    else entry.name)
            if name in self.commands:
                LOG.warning('command %r is defined twice (%s and %s); the '
                            'first is used', name, self.commands[name].value,
                            entry.value)
                continue
            self.commands[name] = entry


class _StartupError(Exception):
    """A project error before any command ran, printed as the others."""

    def __str__(self) -> str:
        return 'error: %s' % self.args[0]


class AmdgpuVirtApp(app.App):
    """The ``amdgpu-virt`` application; holds the parsed configuration."""

    def __init__(self) -> None:
        super().__init__(
            description=DESCRIPTION, version=_version(),
            command_manager=CommandManager('amdgpu_virt.cli'),
            deferred_help=True)
        self.conf: cfg.ConfigOpts | None = None
        #: what stopped initialize_app (cliff prints it and returns 1)
        self.startup_error: BaseException | None = None

    def build_option_parser(self, description: str | None,
                            version: str | None,
                            argparse_kwargs: dict[str, Any] | None = None
                            ) -> argparse.ArgumentParser:
        kwargs = dict(argparse_kwargs or {})
        kwargs.setdefault('epilog', exitcodes.epilog())
        parser = super().build_option_parser(description, version, kwargs)
        # keep the table's line breaks in --help
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.add_argument(
            '--config-file', action='append', default=[], metavar='PATH',
            help='oslo.config file to read (repeatable; later files win). '
                 'Default: none, so every option has its documented default.')
        return parser

    def initialize_app(self, argv: list[str]) -> None:
        try:
            for path in self.options.config_file:
                check_config_file(path)
            try:
                self.conf = av_conf.new_conf(
                    default_config_files=self.options.config_file)
            except cfg.Error as err:
                raise exception.ConfigError(option='--config-file',
                                            reason=str(err)) from None
            check_values(self.conf, self.options.config_file)
        except Exception as err:
            self.startup_error = err
            if isinstance(err, exception.AmdgpuVirtError):
                # cliff prints what it catches here as it is: say "error:"
                # as every command's error line does
                raise _StartupError(err) from err
            raise

    def interact(self) -> None:
        """Without a command, print the help and the command list.

        cliff would start an interactive shell, which an operator typing
        ``amdgpu-virt`` to see what it does does not expect; the exit status
        is 64 (a usage error: no command was run).
        """
        self.run_subcommand(['help'])

    def configure_logging(self) -> None:
        """cliff's handlers (stderr by ``-v``/``-q``, ``--log-file``), with
        the root logger no lower than the lowest of them: cliff sets it to
        DEBUG, which makes every library build debug records nobody
        prints."""
        root = logging.getLogger()
        level, before = root.level, list(root.handlers)
        super().configure_logging()
        added = [h for h in root.handlers if h not in before]
        self._logging = (level, added)
        if added:
            root.setLevel(min(h.level or logging.DEBUG for h in added))

    def run(self, argv: list[str]) -> int:
        """cliff's run, with every outcome mapped to the status table.

        The logging set up for the run is taken down after it, so a
        process that runs commands in turn (a test, an embedding tool)
        keeps its own logging and does not collect handlers.
        """
        try:
            return self._run(argv)
        finally:
            level, added = getattr(self, '_logging', (None, []))
            root = logging.getLogger()
            for handler in added:
                root.removeHandler(handler)
                handler.close()
            if level is not None:
                root.setLevel(level)

    def _run(self, argv: list[str]) -> int:
        try:
            result = super().run(argv)
        except SystemExit as stop:
            # argparse: 2 for a wrong command line, 0 after --help
            return exitcodes.USAGE if stop.code == 2 else int(stop.code or 0)
        except Exception as err:   # re-raised by cliff under --debug
            return exitcodes.status_of(err)
        if self.startup_error is not None:
            return exitcodes.status_of(self.startup_error)
        if getattr(self, 'interactive_mode', False):
            return exitcodes.USAGE
        return int(result)

    def run_subcommand(self, argv: list[str]) -> int:
        try:
            self.command_manager.find_command(argv)
        except ValueError:
            matches = self.get_fuzzy_matches(argv[0])
            self.stderr.write('error: %r is not an amdgpu-virt command; see '
                              'amdgpu-virt --help%s\n' % (
                                  ' '.join(argv), ''.join(
                                      '\n  did you mean: %s' % m
                                      for m in matches)))
            return exitcodes.USAGE
        return int(super().run_subcommand(argv))

    def prepare_to_run_command(self, cmd: Any) -> None:
        """Map what the command raises to its exit status (one place for
        every command)."""
        run = cmd.run
        name = getattr(cmd, 'cmd_name', None) or type(cmd).__name__
        if isinstance(cmd, display.DisplayCommandBase):
            strict_columns(cmd)

        def guarded(parsed_args: argparse.Namespace) -> int:
            try:
                return int(run(parsed_args) or 0)
            except (BrokenPipeError, KeyboardInterrupt):
                raise
            except exception.AmdgpuVirtError as err:
                # through cliff's log: stderr, and --log-file
                (self.LOG.exception if self.options.debug
                 else self.LOG.error)('error: %s', err)
                return exitcodes.status_of(err)
            except Exception as err:
                if isinstance(cmd, help.HelpCommand) and \
                        isinstance(err, ValueError):
                    # ``help <no such command>``
                    self.LOG.error('error: %s; see amdgpu-virt --help', err)
                    return exitcodes.USAGE
                (self.LOG.exception if self.options.debug
                 else self.LOG.error)(
                    'internal error in %s: %s: %s (a bug; run again with '
                    '--debug for the traceback)', name, type(err).__name__,
                    err)
                return exitcodes.SOFTWARE

        cmd.run = guarded

    def get_conf(self) -> cfg.ConfigOpts:
        if self.conf is None:
            self.conf = av_conf.new_conf()
        return self.conf


def strict_columns(cmd: display.DisplayCommandBase) -> None:
    """Make ``-c COLUMN`` naming no column of ``cmd`` a usage error.

    cliff drops unknown names silently while one name is known, and raises
    a ``ValueError`` (an internal error) when none is.
    """
    generate = cmd._generate_columns_and_selector

    def checked(parsed_args: argparse.Namespace,
                column_names: Sequence[str]) -> Any:
        known = {cmd._normalize_column_name(c): c for c in column_names}
        unknown = [c for c in parsed_args.columns or ()
                   if cmd._normalize_column_name(c) not in known]
        if unknown:
            raise exception.UsageError(
                option='-c/--column', reason='no column %s; the columns are '
                '%s' % (', '.join(repr(c) for c in unknown),
                        ', '.join(column_names)))
        return generate(parsed_args, column_names)

    cmd._generate_columns_and_selector = checked  # type: ignore[method-assign]


def check_config_file(path: str) -> None:
    """Refuse a ``--config-file`` oslo.config would hang on or fail to
    decode: only a regular file of UTF-8 text (bounded) is read.

    :raises ConfigError: naming the file and what is wrong with it (a
        missing file is left to oslo.config, which says so).
    """
    try:
        data = fileutil.read_bytes(path, 'configuration file')
        fileutil.decode_text(data, path, 'configuration file')
    except FileNotFoundError:
        return
    except exception.FileInputError as err:
        raise exception.ConfigError(
            option='--config-file %s' % path,
            reason=err.kwargs.get('reason', str(err))) from None


def check_values(conf: cfg.ConfigOpts, files: Sequence[str]) -> None:
    """Read every option once, so that a bad value stops every command.

    oslo.config checks a value only when it is first read, which would let
    a command run for a while (or not notice at all) before failing with a
    message that names neither the group nor the file.

    :raises ConfigError: naming ``[group] option``, the files and what is
        allowed.
    """
    for group, opts in av_conf_opts.list_opts():
        name = group.name if isinstance(group, cfg.OptGroup) else group
        for opt in opts:
            try:
                conf[name][opt.dest]
            except cfg.ConfigFileValueError as err:
                reason = str(err).split(' is not valid: ', 1)[-1]
                choices = getattr(opt.type, 'choices', None)
                if choices:
                    # oslo prints integer choices as an OrderedDict repr
                    found = reason.rsplit('but found ', 1)
                    reason = '%s is not one of %s' % (
                        found[1] if len(found) == 2 else 'the value',
                        ', '.join(str(c) for c in choices))
                raise exception.ConfigError(
                    option='[%s] %s' % (name, opt.name),
                    reason='the value in %s is not valid: %s' % (
                        ', '.join(files) or 'the configuration', reason)
                ) from None


def app_conf(app: Any) -> cfg.ConfigOpts:
    """The configuration of the running ``amdgpu-virt`` application."""
    conf: cfg.ConfigOpts = app.get_conf()
    return conf


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``amdgpu-virt``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return int(AmdgpuVirtApp().run(argv))


if __name__ == '__main__':
    sys.exit(main())
