"""The names of the messages the node programs send up, written once.

Shipped first in every bundle that sends (wire.PROGRAMS: the supervisor's control messages,
the sampler's lines) and imported by the launcher's one decoder (job/events.py, whose
``DECODERS`` maps each name to its event's decoder). A new node message is a name here, its
send in the node program, and its event with its ``decode`` in job/events.py;
tests/test_node_messages.py finds every send of the node programs and fails on a name the
decoder does not know. Standard library only (nothing imported), Python >= 3.8.
"""

# the supervisor's control messages (job/events.py decodes each into its event)
MSG_HELLO = "hello"  # the job started, or could not (also the sampler's first line)
MSG_RANK_START = "rank_start"  # a rank's shim is up
MSG_RANK_RAISED = "rank_raised"  # a rank is failing of its own; its exit follows
MSG_RANK_EXIT = "rank_exit"  # a rank ended: its exit report
MSG_STACKS = "stacks"  # the answer to a stacks request
MSG_FLIGHT = "flight"  # the flight recorder's dumps at the end
MSG_NCCL = "nccl"  # NCCL's lines of one rank
MSG_STOPPING = "stopping"  # the supervisor began stopping its job
MSG_EXIT = "exit"  # the job ended (each rank's exit report again, in ``ranks``)
MSG_HB = "hb"  # the supervisor is alive

# the sampler's lines (job/events.py decode_sample)
MSG_SAMPLE = "sample"

CONTROL_MESSAGES = (MSG_HELLO, MSG_RANK_START, MSG_RANK_RAISED, MSG_RANK_EXIT, MSG_STACKS,
                    MSG_FLIGHT, MSG_NCCL, MSG_STOPPING, MSG_EXIT, MSG_HB)
SAMPLER_MESSAGES = (MSG_HELLO, MSG_SAMPLE)
