"""What the tests share and are not tests themselves: executions brought into each state
through the store (``helpers``), the REST API's users and clients (``api``), browsers
(``browser``), real worker clusters (``clusters``), a real WSGI server (``server``), other
processes (``processes``), fuzzing strategies (``fuzz``), fakes of the replay core's host
(``replay_fakes``), the store's model (``store_model``), and the component modules the test
workers serve (``components``, ``workflows``, ``workflow_components``,
``console_components``; ``OBELISK['COMPONENT_MODULES']`` in ``tests/settings_*.py``).
"""
