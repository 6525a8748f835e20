"""Helpers the tests share (`from tests.support.fakes import FakeDevice`); no tests here."""
