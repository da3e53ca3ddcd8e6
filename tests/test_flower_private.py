"""Every private Flower name fedpriv uses (``simulations._flower_private``, and the tests'
``tests.flower.metadata``) still exists and takes what fedpriv passes: a Flower upgrade that
moves one fails here, by name."""

import inspect

from simulations._flower_private import RUN_SIMULATION_PARAMETERS, run_simulation, task_identity


def test_run_simulation_takes_every_parameter_fedpriv_passes():
    from flwr.simulation.run_simulation import _run_simulation

    parameters = inspect.signature(_run_simulation).parameters
    missing = [name for name in RUN_SIMULATION_PARAMETERS if name not in parameters]
    assert not missing, f"flwr's _run_simulation no longer takes {missing}: update simulations/_flower_private.py"


def test_run_simulation_refuses_a_parameter_it_does_not_list():
    import pytest

    with pytest.raises(TypeError, match="not a parameter fedpriv passes"):
        run_simulation(None, num_supernodes=1, verbose_logging=True)


def test_task_identity_is_set_for_a_block_and_restored():
    from flwr.app import Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    before = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    with task_identity(run_id=7, task_id=3, node_id=0):
        message = Message(RecordDict(), dst_node_id=5, message_type="query")
        assert message.metadata.run_id == 7
    assert (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id) == before


def test_set_metadata_reads_back(task_identity):
    from flwr.app import Message, RecordDict

    from tests.flower.metadata import set_metadata

    message = set_metadata(Message(RecordDict(), dst_node_id=5, message_type="query"), message_id="m", src_node_id=9)
    assert (message.metadata.message_id, message.metadata.src_node_id) == ("m", 9)
