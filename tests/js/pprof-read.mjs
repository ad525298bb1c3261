// Decode a pprof file with the npm pprof-format package (the reader under test, not
// profkit's code) and print what it read as JSON: sample types, period, times,
// comments, mappings, functions, and every sample as its stack (function names root
// first, joined by ";"), values, mapping files (root first) and labels.
// Usage: node pprof-read.mjs FILE.pb.gz
import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { Profile } from 'pprof-format';

const raw = readFileSync(process.argv[2]);
const bytes = raw[0] === 0x1f && raw[1] === 0x8b ? gunzipSync(raw) : raw;
const p = Profile.decode(bytes);
const str = (i) => p.stringTable.strings[Number(i)];
const num = (v) => Number(v);
const fns = new Map(p.function.map((f) => [num(f.id), f]));
const maps = new Map(p.mapping.map((m) => [num(m.id), m]));
const locs = new Map(p.location.map((l) => [num(l.id), l]));
const out = {
  stringTable0: p.stringTable.strings[0],
  sampleType: p.sampleType.map((t) => [str(t.type), str(t.unit)]),
  periodType: p.periodType ? [str(p.periodType.type), str(p.periodType.unit)] : null,
  period: num(p.period),
  timeNanos: String(p.timeNanos),
  durationNanos: String(p.durationNanos),
  defaultSampleType: str(p.defaultSampleType),
  comments: p.comment.map(str),
  mappings: p.mapping.map((m) => ({ id: num(m.id), file: str(m.filename),
                                    hasFunctions: m.hasFunctions })),
  functions: p.function.map((f) => ({ id: num(f.id), name: str(f.name),
                                      systemName: str(f.systemName),
                                      file: str(f.filename) })),
  samples: p.sample.map((s) => {
    const ids = s.locationId.map(num).reverse();
    const lines = ids.map((id) => locs.get(id).line[0]);
    return {
      stack: lines.map((ln) => str(fns.get(num(ln.functionId)).name)).join(';'),
      modules: ids.map((id) => {
        const m = maps.get(num(locs.get(id).mappingId));
        return m ? str(m.filename) : '';
      }),
      values: s.value.map(num),
      labels: Object.fromEntries(s.label.map((l) => [str(l.key), str(l.str)])),
    };
  }),
};
process.stdout.write(JSON.stringify(out) + '\n');
