// Filling the Envoy YAML templates under envoy/: `{{NAME}}` placeholders in string scalars are
// replaced by values. A scalar that is exactly one placeholder takes the value's own type, so
// `port_value: "{{LISTEN_PORT}}"` becomes a number and the template stays valid YAML.
import { parse } from 'yaml';
import { AsbError } from '../errors.ts';

export type TemplateValue = string | number | boolean;
export type TemplateValues = Readonly<Record<string, TemplateValue>>;

/** A parsed YAML/JSON tree. */
export type ConfigNode = string | number | boolean | null | ConfigNode[] | { [key: string]: ConfigNode };
export type ConfigObject = { [key: string]: ConfigNode };

const PLACEHOLDER = /\{\{([A-Z0-9_]+)\}\}/g;
const WHOLE_PLACEHOLDER = /^\{\{([A-Z0-9_]+)\}\}$/;

export function parseTemplate(text: string, source: string): ConfigObject {
  let tree: unknown;
  try {
    tree = parse(text);
  } catch (err) {
    throw new AsbError('Invalid', `Envoy template ${source} is not valid YAML: ${(err as Error).message}`, { cause: err });
  }
  if (!isConfigObject(tree)) throw new AsbError('Invalid', `Envoy template ${source} must be a YAML mapping`);
  return tree;
}

/** Returns a copy of node with every placeholder replaced; an unknown placeholder is an error (a typo must not reach Envoy). */
export function fillTemplate(node: ConfigNode, values: TemplateValues): ConfigNode {
  if (typeof node === 'string') return fillString(node, values);
  if (Array.isArray(node)) return node.map((item) => fillTemplate(item, values));
  if (node !== null && typeof node === 'object') {
    const out: ConfigObject = {};
    for (const [key, value] of Object.entries(node)) out[fillString(key, values).toString()] = fillTemplate(value, values);
    return out;
  }
  return node;
}

function fillString(text: string, values: TemplateValues): TemplateValue {
  const whole = WHOLE_PLACEHOLDER.exec(text);
  if (whole !== null) return lookup(whole[1] ?? '', values);
  return text.replace(PLACEHOLDER, (_match, name: string) => String(lookup(name, values)));
}

function lookup(name: string, values: TemplateValues): TemplateValue {
  const value = values[name];
  if (value === undefined) throw new AsbError('Invalid', `Envoy template placeholder {{${name}}} has no value`);
  return value;
}

/** Names of the placeholders used anywhere under node. */
export function placeholdersIn(node: ConfigNode): Set<string> {
  const names = new Set<string>();
  const visit = (n: ConfigNode): void => {
    if (typeof n === 'string') {
      for (const m of n.matchAll(PLACEHOLDER)) names.add(m[1] ?? '');
    } else if (Array.isArray(n)) {
      n.forEach(visit);
    } else if (n !== null && typeof n === 'object') {
      for (const [key, value] of Object.entries(n)) {
        visit(key);
        visit(value);
      }
    }
  };
  visit(node);
  return names;
}

export function isConfigObject(value: unknown): value is ConfigObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The object at key, or an error naming the path (the template lost a part the generator relies on). */
export function objectAt(node: ConfigObject, key: string, path: string): ConfigObject {
  const value = node[key];
  if (!isConfigObject(value)) throw new AsbError('Invalid', `Envoy template: ${path}.${key} must be a mapping`);
  return value;
}

export function arrayAt(node: ConfigObject, key: string, path: string): ConfigNode[] {
  const value = node[key];
  if (!Array.isArray(value)) throw new AsbError('Invalid', `Envoy template: ${path}.${key} must be a list`);
  return value;
}

/** The list entry whose `name` equals name. */
export function namedEntry(list: ConfigNode[], name: string, path: string): ConfigObject {
  const found = list.find((item) => isConfigObject(item) && item.name === name);
  if (found === undefined || !isConfigObject(found)) throw new AsbError('Invalid', `Envoy template: ${path} has no entry named ${name}`);
  return found;
}
