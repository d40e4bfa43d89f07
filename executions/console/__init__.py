"""The operator console: the Django admin's pages of the ``executions`` app, read-only.

A tenant of the apps it shows: ``executions.admin`` (Django's autodiscovery) registers the
pages here, and ``deployments.admin`` registers its own with the same read-only base.
Every page reads through ``executions.store`` and ``executions.client``; every action goes
through the client (audited, ``via="admin"``), never through a model form.

- ``readonly``: the read-only base of every console page, with ids as they are in links;
- ``urls``: the console's addresses of an execution and of its actions;
- ``limits``: the capped count and paginator, reads without JIT; ``filters``: the list's
  filters; ``search``: the list's search; ``columns``: the list's columns and rows;
- ``actions``: what applies to an execution, and doing it (one, or many at once);
- ``execution_admin``: the executions list and page; ``page``: the page's sections;
- ``audit``: the audit trail across executions; ``delays_and_logs``: the two raw tables.

why: D51, D90, D93, D94, D95
"""
