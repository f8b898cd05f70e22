// Whether a path is there (anything the caller may stat: a file, a directory, a link's target).
import { access } from 'node:fs/promises';

export function exists(path: string): Promise<boolean> {
  return access(path).then(() => true, () => false);
}
