// Where a path an envd caller names lands inside the sandbox, as envd's
// permissions.ExpandAndResolve decides it (packages/envd/internal/permissions/path.go):
//
//   "/a/../b"  → "/b"            absolute: as it is, normalised (as before; envd leaves it uncleaned)
//   "~"        → home
//   "~/x"      → home + "/x"     ("~\x" too: envd takes either separator after the tilde)
//   "x", "./x" → home + "/x"     relative: from the home of the user the request runs as
//   "../.."    → "/"             a climb above / stays at /, as for absolute paths
//   ""         → home            (envd: its default workdir when /init set one, else the home)
//   "~other/x" → 400             envd: "cannot expand user-specific home dir"
//
// Pure: the caller looks the home up (UserIds.homeOf) only when needsHome says so, and the result
// is used exactly as an absolute path from the request would be: every operation runs inside the
// sandbox (its mount namespace, as its user), so no path, wherever its home came from, reaches
// beyond the sandbox's own root.
import { posix } from 'node:path';
import { AsbError } from '../../errors.ts';

/** PATH_MAX on Linux: a longer path fails there anyway, and this bounds what we pass on. */
export const MAX_PATH_LENGTH = 4096;

/** A path from a request, checked but not resolved: a string without NUL, at most MAX_PATH_LENGTH. */
export function pathField(value: unknown, field = 'path', required = false): string {
  if (value === undefined || value === null) value = '';
  if (typeof value !== 'string') throw new AsbError('BadRequest', `${field} must be a string: a path inside the sandbox`, { fields: [{ field, message: 'must be a string' }] });
  if (required && value === '') throw new AsbError('BadRequest', `${field} is required: a path inside the sandbox`, { fields: [{ field, message: 'is required' }] });
  if (value.includes('\0')) throw new AsbError('BadRequest', `${field} contains a NUL byte`, { fields: [{ field, message: 'contains a NUL byte' }] });
  if (value.length > MAX_PATH_LENGTH) throw new AsbError('BadRequest', `${field} is longer than ${MAX_PATH_LENGTH} characters`, { fields: [{ field, message: `is longer than ${MAX_PATH_LENGTH} characters` }] });
  return value;
}

/** Whether resolving `path` needs the user's home: relative, empty, or starting with ~. */
export function needsHome(path: string): boolean {
  return !path.startsWith('/');
}

/** The absolute, normalised path `path` names for a user whose home is `home` (see the table above). */
export function resolvePath(path: string, home: string, field = 'path'): string {
  if (path.startsWith('~')) {
    const sep = path.charAt(1);
    if (sep !== '' && sep !== '/' && sep !== '\\') {
      throw new AsbError('BadRequest', `${field} "${path.slice(0, 200)}" names another user's home (~name); only ~ (the calling user's home) is expanded`, { fields: [{ field, message: 'cannot expand another user\'s home' }] });
    }
    return posix.resolve('/', home, `./${path.slice(1)}`);
  }
  return posix.resolve('/', home, path);
}

/** A request's path field resolved for its user; `home` is asked only when the path needs it. */
export async function userPath(home: () => Promise<string>, value: unknown, field = 'path'): Promise<string> {
  const path = pathField(value, field);
  return resolvePath(path, needsHome(path) ? await home() : '/', field);
}
