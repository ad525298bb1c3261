/*
 * Test probe for the sampled_timing patch (tests/test_sampled_timing.py): calls the
 * patched InstrStartNode()/InstrStopNode() on Instrumentation structs of its own, as
 * ExecProcNodeInstr() does, and returns what the estimator added to the counter per
 * call.  Built against the sampled_timing build's server headers; not installed: the
 * test creates the function from this library's absolute path on its own cluster.
 *
 *   sampled_timing_probe('leaf', calls, 0, work)
 *       calls of one node, every call timed with weight 1 (an exact call); returns
 *       each call's contribution in ns, unclamped.
 *   sampled_timing_probe('shifted', calls, 0, ticks)
 *       the same with nothing inside, each call's start moved `ticks` later (as if
 *       the call took less than nothing): its contribution must come out negative,
 *       as it is, not floored at 0.
 *   sampled_timing_probe('rows' | 'untimed' | 'timed', calls, inner, work)
 *       calls of a parent node (timed, weight 1), each wrapping `inner` calls of a
 *       child: under TIMING FALSE ('rows'), sampled and never timed ('untimed'), or
 *       sampled and timed on every call ('timed'); returns the parent's contribution
 *       per call in ns.
 *
 * work: iterations of a few ns of dependent arithmetic inside each innermost call
 * (for 'leaf', 0 = nothing between the start and the stop, not even a call).
 */
#include "postgres.h"

#include <limits.h>

#include "catalog/pg_type_d.h"
#include "executor/instrument.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(sampled_timing_probe);

static pg_noinline uint64
probe_work(uint64 x, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = 0; j < 4; j++)
			x = x * UINT64CONST(6364136223846793005) + UINT64CONST(1442695040888963407);
	return x;
}

/* Calls through pointers, out of line, as ExecProcNodeInstr() makes them. */
static void (*volatile start_ptr) (Instrumentation *) = InstrStartNode;
static void (*volatile stop_ptr) (Instrumentation *, double) = InstrStopNode;

static void
sampled(Instrumentation *instr, int options)
{
	InstrInit(instr, options);
	InstrSampleTiming(instr, 100);
}

Datum
sampled_timing_probe(PG_FUNCTION_ARGS)
{
	char	   *mode = text_to_cstring(PG_GETARG_TEXT_PP(0));
	int			calls = PG_GETARG_INT32(1);
	int			inner = PG_GETARG_INT32(2);
	int			work = PG_GETARG_INT32(3);
	void		(*start) (Instrumentation *) = start_ptr;
	void		(*stop) (Instrumentation *, double) = stop_ptr;
	Instrumentation parent,
				child;
	Datum	   *out;
	volatile uint64 sink;
	uint64		x = 1;
	bool		shifted = strcmp(mode, "shifted") == 0;
	bool		leaf = shifted || strcmp(mode, "leaf") == 0;
	bool		timed = strcmp(mode, "timed") == 0;

	if (calls < 1 || inner < 0 || work < 0)
		elog(ERROR, "calls must be >= 1, inner and work >= 0");
	if (!leaf && !timed && strcmp(mode, "rows") != 0 && strcmp(mode, "untimed") != 0)
		elog(ERROR, "mode must be leaf, shifted, rows, untimed or timed");

	/* the measured node: every call timed, weight 1 (as a node's first calls are) */
	sampled(&parent, INSTRUMENT_TIMER);
	if (parent.sample_rate <= 1)
		elog(ERROR, "this build does not sample (is it sampled_timing?)");
	parent.sample_exact = INT_MAX;
	if (strcmp(mode, "rows") == 0)
		InstrInit(&child, INSTRUMENT_ROWS);
	else
	{
		sampled(&child, INSTRUMENT_TIMER);
		child.sample_exact = 0;
		child.sample_heavy = PG_UINT64_MAX;
		child.sample_skip = strcmp(mode, "untimed") == 0 ? INT_MAX : 0;
	}

	out = palloc(sizeof(Datum) * calls);
	for (int c = 0; c < calls; c++)
	{
		int64		before = parent.counter.ticks;
		instr_time	delta;

		start(&parent);
		if (shifted)
			parent.starttime.ticks += work;	/* as if started `work` ticks later */
		else if (leaf)
		{
			if (work > 0)		/* 0: nothing at all between start and stop */
				x = probe_work(x, work);
		}
		else
			for (int i = 0; i < inner; i++)
			{
				if (timed)		/* timed; as in the sampler's bursts of 8, one
								 * call in 8 ends a burst and draws the next gap */
					child.sample_skip = i % 8 == 0 ? -1 : -2;
				start(&child);
				x = probe_work(x, work);
				stop(&child, 1.0);
			}
		stop(&parent, 1.0);
		delta.ticks = parent.counter.ticks - before;
		out[c] = Float8GetDatum((double) INSTR_TIME_GET_NANOSEC(delta));
	}
	sink = x;
	(void) sink;
	PG_RETURN_ARRAYTYPE_P(construct_array_builtin(out, calls, FLOAT8OID));
}
