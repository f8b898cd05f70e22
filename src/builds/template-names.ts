// Template names as E2B writes them: `name` or `name:tag`. A template has an id (`<cluster
// tag><16 random>`, like a sandbox id, so routers send /templates/<id>… to the owning cluster with
// no lookup) and a name (E2B's alias) unique within its team; two teams may both have "my-env".
// The SandboxTemplate object is named by the id and labelled with the team (LABEL.owner) and the
// name (TEMPLATE_NAME_LABEL): claims resolve a team's name to its id (src/worker/team-templates.ts),
// and another team's ids and names answer as absent everywhere (status, logs, files,
// from_template, delete).
import { AsbError } from '../errors.ts';

/** E2B names: `name` or `name:tag`; the name part is what a team's templates are unique by. */
const NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** A SandboxTemplate name (DNS-1123 subdomain, short form). */
export const OBJECT_NAME = /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/;
const TAG = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/** `name:tag` with a valid name and tag: a build of `name` that the tag names once it is ready. */
export function isTaggedName(full: string): boolean {
  const { name, tag } = splitName(full);
  return tag !== undefined && NAME.test(name) && TAG.test(tag);
}

export function splitName(full: string): { name: string; tag: string | undefined } {
  const colon = full.indexOf(':');
  return colon === -1 ? { name: full, tag: undefined } : { name: full.slice(0, colon), tag: full.slice(colon + 1) };
}

export function checkTemplateName(full: string, field = 'name'): { name: string; tag: string | undefined } {
  const parts = splitName(full.trim());
  if (!NAME.test(parts.name)) throw new AsbError('BadRequest', `${field} "${full}" is not a template name: 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (optionally :tag)`);
  if (parts.tag !== undefined && !TAG.test(parts.tag)) throw new AsbError('BadRequest', `${field} "${full}": tag "${parts.tag}" is not a tag (1-63 letters, digits, '.', '_' or '-')`);
  return parts;
}
