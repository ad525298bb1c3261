/*
 * vcpu_calib.c -- how fast is this vCPU right now? For profkit.collect.vcpu.
 *
 * Compiled at run time by profkit (gcc -O2) into ~/.cache/profkit/tools/,
 * keyed by this file's hash, like clock_bench.c.  It stays running for a whole
 * benchmark (pinned by the caller to the CPU the measured backend runs on) and
 * answers requests on stdin, one per line:
 *
 *     <loops>\n          run the fixed calibration work <loops> times
 *
 * and prints one line per request:
 *
 *     <cpu_ns> <wall_ns> <cpu>\n
 *
 * cpu_ns is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID) over the work,
 * wall_ns CLOCK_MONOTONIC over it, cpu the CPU it ended on (sched_getcpu).
 * The work is the same instruction stream every time (a fixed pseudo-random
 * walk over a 128 KiB table, with a data-dependent branch and a multiply chain:
 * loads, branches and integer work, like an executor's per-row loop), so
 * cpu_ns varies only with how fast the vCPU executes it: a host that runs
 * another guest on the same physical core, or throttles, shows up as a longer
 * cpu_ns -- which a backend's CPU time from /proc cannot tell from real work.
 *
 * Before the timed work, untimed, every line of the table is read and part of
 * the walk runs (see below): the measured backend has just run on this CPU (and the CPU may
 * have idled while the client read the result), and without this the
 * calibration after an execution paid for bringing its table and its branch
 * history back -- more after a longer execution. The calibrations
 * after EXPLAIN ANALYZE with TIMING were 3 % slower than those before it in the
 * median (0.5 % after the plain query), up to 6 % in one run, whose three
 * TIMING-on executions were all rejected for a slow vCPU; with the untimed pass
 * the gap is under 0.5 % in every mode (benchmarks/vcpu_after_gap.py).
 * The untimed walk is half the timed one (loops / 2 units, at least one): on
 * another host (AMD EPYC, 2026-12-05) a vCPU that had idled for 20 ms ran the
 * next calibration 4-5 % slower in the median (1.041, 1.053) after a single untimed unit (the
 * CPU still waking up, likely; tests/test_vcpu.py failed in two make test runs, and
 * passed 6 of 6 with half), and the slow-vCPU rule rejected 44 of 240
 * executions of vanilla against itself on nested_loop, 15 of 240 with half
 * (benchmarks/results/vcpu_after_gap-20261205b.txt).  After 20 ms idle and
 * 16 MB streamed, the median ratio after/before over 101 rounds was 1.028-1.045
 * with one unit, 1.004-1.011 with half, 1.000-1.011 with all of the walk
 * (benchmarks/results/vcpu_idle_gap-20261206.txt, 8 repeats).
 * An empty line or EOF ends the program.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define TABLE_WORDS (128 * 1024 / sizeof(uint32_t))

/*
 * The untimed walk, in quarters of the timed one (2: half).  profkit compiles
 * the helper as it is; benchmarks/vcpu_idle_gap.py compiles it with other
 * values (-DWARMUP_QUARTERS=0 is one unit) to compare them.
 */
#ifndef WARMUP_QUARTERS
#define WARMUP_QUARTERS 2
#endif

static uint32_t table[TABLE_WORDS];

static inline uint64_t
ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

/* Every 64-byte line of the table read once (the untimed pass). */
static uint32_t
touch(void)
{
	uint32_t	sum = 0;

	for (size_t i = 0; i < TABLE_WORDS; i += 16)
		sum += table[i];
	return sum;
}

/* One unit of work: 4096 dependent steps of the walk. */
static uint64_t
work(uint64_t loops)
{
	uint64_t	acc = 0x9e3779b97f4a7c15ULL;
	uint32_t	idx = 1;

	for (uint64_t i = 0; i < loops; i++)
	{
		for (int j = 0; j < 4096; j++)
		{
			uint32_t	v = table[idx];

			if (v & 1)
				acc = acc * 6364136223846793005ULL + v;
			else
				acc ^= (acc >> 17) + v;
			idx = (v ^ (uint32_t) acc) & (TABLE_WORDS - 1);
		}
	}
	return acc;
}

int
main(void)
{
	char		line[64];
	uint64_t	x = 88172645463325252ULL;
	volatile uint64_t sink;

	for (size_t i = 0; i < TABLE_WORDS; i++)
	{
		/* xorshift: a fixed table, the same every run */
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		table[i] = (uint32_t) x;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin) != NULL)
	{
		char	   *end;
		unsigned long long loops = strtoull(line, &end, 10);
		uint64_t	c0, w0, c1, w1;
		uint64_t	warm = loops * WARMUP_QUARTERS / 4;

		if (end == line)
			break;
		sink = touch() + work(warm > 0 ? warm : 1);
		c0 = ns(CLOCK_THREAD_CPUTIME_ID);
		w0 = ns(CLOCK_MONOTONIC);
		sink = work(loops);
		c1 = ns(CLOCK_THREAD_CPUTIME_ID);
		w1 = ns(CLOCK_MONOTONIC);
		(void) sink;
		printf("%llu %llu %d\n", (unsigned long long) (c1 - c0),
			   (unsigned long long) (w1 - w0), sched_getcpu());
	}
	return 0;
}
