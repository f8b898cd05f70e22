import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { parseAllDocuments } from 'yaml';
import { parseManifests } from '../src/api/manifest.ts';
import type { SandboxSpec } from '../src/api/types.ts';
import { isAsbError } from '../src/errors.ts';

const SEEDS = new URL('./fixtures/seeds/', import.meta.url);
const SEED_FILES = [
  'sandbox-example.yaml', 'getting-started.yaml', 'sandboxtemplate.yaml', 'sandboxwarmpool.yaml',
  'sandboxclaim-v1alpha1.yaml', 'sandboxclaim-v1beta1.yaml',
] as const;

function seed(name: string): string {
  return readFileSync(new URL(name, SEEDS), 'utf8');
}

/** Runs parseManifests expecting a rejection; returns the error's code, message and fields. */
function rejection(text: string, source?: string): { code: string; message: string; fields: Record<string, string> } {
  try {
    parseManifests(text, source);
  } catch (err) {
    assert.ok(isAsbError(err), `expected an AsbError, got ${String(err)}`);
    return { code: err.code, message: err.message, fields: Object.fromEntries(err.fields.map((f) => [f.field, f.message])) };
  }
  assert.fail('expected the manifest to be rejected');
}

test('the seeds\' k8s-sigs examples parse and validate unchanged', () => {
  for (const file of SEED_FILES) {
    const text = seed(file);
    const objects = parseManifests(text, file);
    assert.equal(objects.length, 1, file);
    // What is stored is exactly what the user wrote: no pruning, no defaults at parse time.
    assert.deepEqual(objects, parseAllDocuments(text).map((d) => d.toJS() as unknown), file);
  }
});

test('the getting-started sandbox keeps its empty image', () => {
  const box = parseManifests(seed('getting-started.yaml'))[0]!;
  assert.equal(box.kind, 'Sandbox');
  assert.equal((box.spec as SandboxSpec).podTemplate.spec.containers[0]?.image, null);
});

test('several documents in one file, empty documents skipped, order kept', () => {
  const text = ['---', '# only a comment', '---', seed('sandboxtemplate.yaml'), '---', seed('sandboxwarmpool.yaml'), '---', ''].join('\n');
  const objects = parseManifests(text);
  assert.deepEqual(objects.map((o) => `${o.kind}/${o.metadata.name}`), [
    'SandboxTemplate/secure-datascience-template', 'SandboxWarmPool/sandboxwarmpool-example',
  ]);
  assert.deepEqual(parseManifests(''), []);
});

test('JSON input works too', () => {
  const [pool] = parseManifests(JSON.stringify({
    apiVersion: 'extensions.agents.x-k8s.io/v1beta1', kind: 'SandboxWarmPool', metadata: { name: 'p' }, spec: { replicas: 2, sandboxTemplateRef: { name: 't' } },
  }), 'pool.json');
  assert.equal(pool?.metadata.name, 'p');
});

test('a kubectl List is applied item by item', () => {
  const list = `apiVersion: v1\nkind: List\nitems:\n${['sandboxwarmpool.yaml', 'sandboxclaim-v1beta1.yaml'].map((f) => `- ${seed(f).replace(/\n/g, '\n  ')}`).join('\n')}\n`;
  assert.deepEqual(parseManifests(list).map((o) => o.kind), ['SandboxWarmPool', 'SandboxClaim']);
});

test('a YAML syntax error names the source, the document and the line', () => {
  const text = `${seed('sandboxwarmpool.yaml')}---\napiVersion: agents.x-k8s.io/v1alpha1\nkind: Sandbox\nmetadata:\n  name: [broken\nspec: {}\n`;
  const err = rejection(text, 'pools.yaml');
  assert.equal(err.code, 'BadRequest');
  // The parser notices the unclosed '[' on the line after it opened; line numbers count the whole file.
  const line = text.split('\n').findIndex((l) => l.includes('[broken')) + 1;
  assert.match(err.message, new RegExp(`^pools\\.yaml#2: YAML syntax error at line ${line + 1}, column \\d+: `));
  assert.deepEqual(Object.keys(err.fields), ['pools.yaml#2']);

  const dup = rejection('apiVersion: a\napiVersion: b\n', 'dup.yaml');
  assert.match(dup.message, /^dup\.yaml#1: YAML syntax error at line 2, column 1: Map keys must be unique/);
});

test('validation problems from every document come back together, prefixed with source and document', () => {
  const badPool = seed('sandboxwarmpool.yaml').replace('replicas: 1', 'replicas: -3');
  const badBox = seed('sandbox-example.yaml').replace('name: sandbox-example', 'name: Sandbox_Example').replace('image: busybox', 'image: 42');
  const err = rejection([seed('sandboxtemplate.yaml'), badPool, badBox].join('---\n'), 'apply.yaml');
  assert.equal(err.code, 'Invalid');
  assert.deepEqual(err.fields, {
    'apply.yaml#2.spec.replicas': 'must be at least 0, got -3',
    'apply.yaml#3.metadata.name': 'must be a DNS label: lower-case letters, digits and \'-\', starting and ending with a letter or digit, got "Sandbox_Example"',
    'apply.yaml#3.spec.podTemplate.spec.containers[0].image': 'must be a string, got number',
  });
  assert.match(err.message, /^SandboxWarmPool "sandboxwarmpool-example" is invalid: apply\.yaml#2\.spec\.replicas/);
  assert.match(err.message, /\nSandbox "Sandbox_Example" is invalid: /);
});

test('unknown fields, missing containers and bad times in a manifest read as a user would fix them', () => {
  const text = `apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata:
  name: box
spec:
  operatingMode: Running
  shutdownTime: "next friday"
  podTemplate:
    spec:
      containers: []
  volumeClaimTemplate: []
`;
  assert.deepEqual(rejection(text, 'box.yaml').fields, {
    'box.yaml#1.spec.volumeClaimTemplate': 'unknown field; did you mean "volumeClaimTemplates"?',
    'box.yaml#1.spec.podTemplate.spec.containers': 'must list at least one container',
    'box.yaml#1.spec.shutdownTime': 'must be an RFC 3339 time such as 2026-12-31T23:59:59Z, got "next friday"',
  });
  assert.deepEqual(rejection('just a string\n').fields, { 'manifest#1': 'must be an object, got string' });
});
