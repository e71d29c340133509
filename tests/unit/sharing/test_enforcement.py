"""The memory enforcement vocabulary: levels, their order, requirements."""

from __future__ import annotations

import testtools

from amdgpu_virt.sharing import enforcement
from amdgpu_virt.sharing.enforcement import Level
from amdgpu_virt.sharing.enforcement import Requirement


class LevelTest(testtools.TestCase):

    def test_values_are_the_published_vocabulary(self) -> None:
        self.assertEqual(['kernel', 'hook', 'kernel+hook', 'none'],
                         [level.value for level in Level])

    def test_of(self) -> None:
        self.assertIs(Level.KERNEL_HOOK, Level.of(True, True))
        self.assertIs(Level.KERNEL, Level.of(True, False))
        self.assertIs(Level.HOOK, Level.of(False, True))
        self.assertIs(Level.NONE, Level.of(False, False))

    def test_label_form_is_label_safe_and_read_back(self) -> None:
        self.assertEqual('kernel-hook', Level.KERNEL_HOOK.label)
        for level in Level:
            self.assertRegex(level.label, r'^[a-z]+(-[a-z]+)?$')
            self.assertIs(level, Level.from_text(level.label))
            self.assertIs(level, Level.from_text(level.value))
        self.assertIsNone(Level.from_text('Kernel'))
        self.assertIsNone(Level.from_text(None))

    def test_weakest(self) -> None:
        self.assertIs(Level.HOOK, enforcement.weakest(
            [Level.KERNEL_HOOK, Level.HOOK, Level.KERNEL]))
        self.assertIs(Level.KERNEL, enforcement.weakest(
            [Level.KERNEL_HOOK, Level.KERNEL]))
        self.assertIs(Level.NONE, enforcement.weakest(list(Level)))
        self.assertIsNone(enforcement.weakest([]))


class RequirementTest(testtools.TestCase):

    TABLE = {
        # requirement: levels that meet it
        Requirement.KERNEL_OR_HOOK: {Level.KERNEL, Level.HOOK,
                                     Level.KERNEL_HOOK},
        Requirement.KERNEL: {Level.KERNEL, Level.KERNEL_HOOK},
        Requirement.HOOK: {Level.HOOK, Level.KERNEL_HOOK},
        Requirement.KERNEL_AND_HOOK: {Level.KERNEL_HOOK},
        Requirement.NONE: set(Level),
    }

    def test_met_by(self) -> None:
        for requirement, meeting in self.TABLE.items():
            for level in Level:
                self.assertEqual(level in meeting, requirement.met_by(level),
                                 (requirement, level))

    def test_an_unknown_level_meets_only_none(self) -> None:
        self.assertEqual([Requirement.NONE],
                         [r for r in Requirement if r.met_by(None)])

    def test_namespace_label(self) -> None:
        label = enforcement.NAMESPACE_LABEL
        self.assertEqual((None, None),
                         enforcement.namespace_requirement({'a': 'b'}))
        self.assertEqual((None, None),
                         enforcement.namespace_requirement(None))
        self.assertEqual((Requirement.KERNEL, None),
                         enforcement.namespace_requirement({label: 'kernel'}))
        wanted, problem = enforcement.namespace_requirement(
            {label: 'strict'})
        self.assertIsNone(wanted)
        self.assertIn(label, problem or '')
        self.assertIn("'strict'", problem or '')

    def test_refusal_names_the_source(self) -> None:
        self.assertIsNone(enforcement.refusal(
            Requirement.KERNEL, Level.KERNEL_HOOK, 'x'))
        why = enforcement.refusal(Requirement.KERNEL, Level.HOOK,
                                  'namespace label y')
        self.assertIn('memory enforcement hook', why or '')
        self.assertIn('namespace label y requires the kernel', why or '')
        self.assertIn('unknown', enforcement.refusal(
            Requirement.KERNEL, None, 'z') or '')

    def test_registered_level(self) -> None:
        self.assertIs(Level.KERNEL, enforcement.registered_level(
            {enforcement.CUSTOMINFO_KEY: 'kernel'}))
        self.assertIsNone(enforcement.registered_level({}))
        self.assertIsNone(enforcement.registered_level(
            {enforcement.CUSTOMINFO_KEY: 7}))
